"""The localiser's proof of its blame (``prove``): the run replayed again with the wrong
operators on the host, the next one found joining them, up to ``MAX_ON_HOST``, the last rerun
judged as ``ops --prove`` judges a what-if run (``ops.proof.rerun_wrong``), so the two cannot
contradict each other."""

from __future__ import annotations

from ..ops import localised as localised_answers
from ..ops import proof as proof_judgement
from ..probe import host_ops
from .findings import Localised, Replay
from .localise_words import operator_words, step_words
from .tracer import ROOT_LABEL

#: The most operators the proof (``prove``) puts on the host at once: past them the next wrong
#: operator is named, not proven.
MAX_ON_HOST = 3


def prove(found: Localised, host_kernels: tuple[bool, str | None], rerun) -> dict | None:
    """Whether the first wrong operator of ``found`` is the whole fault: the run again
    (``rerun(names)``: the checked replay with the operators ``names`` on the host,
    ``probe.host_ops.on_host``; returns its ``Localised``, its output judged against the CPU
    reference where no operator is wrong, and the host kernels' calls) with that operator on the
    host, so its CPU kernel runs in the device's place. When the rerun finds another wrong
    operator, it is not enough: that one joins the others on the host and the run replays again,
    up to ``MAX_ON_HOST`` operators on the host (the bound said when reached), so a chain of
    wrong operators (silu wrong in the MLP, a softmax wrong from 38 key positions on) is named
    whole, each where it first goes wrong. A rerun with none wrong is judged as ``ops --prove``
    judges a what-if run (``ops.proof.rerun_wrong``: it ran to its end and its output matches the
    CPU reference, over every step of the run), so the two never contradict each other:
    confirmed, for the whole chain at once; else "not confirmed" with why. A divergence the
    replay cannot reach (``Replay.unreached``) is never confirmed. An operator that cannot go to
    the host (``host_ops.refusals``: a view, an operator the CPU has no kernel of...) or a device
    whose adapter takes no host kernels (``host_kernels``: its ``(False, why)``) ends the proof
    with a sentence saying so, by name and why. None when nothing is wrong.

    The proof, as stored: ``verdict`` (confirmed, not confirmed, not reached, bound, refused, no
    host kernels, not taken, raised), ``matches`` (the last rerun matched), ``chain`` (every
    wrong operator named, the first first, the step it went wrong at and the name each was put on
    the host as), ``on_host`` (the last rerun's), ``reruns`` (each one's operators on the host,
    counts, steps run, next wrong operator, numerics, failure, host calls), ``bound`` and
    ``sentences`` (what the command prints)."""
    if found.first is None:
        return None
    sentences: list[str] = []
    proof: dict = {
        "verdict": None,
        "matches": False,
        "bound": MAX_ON_HOST,
        "chain": [],
        "on_host": [],
        "reruns": [],
    }
    proof["sentences"] = sentences
    entry = found.first
    able, why = host_kernels
    proof["chain"].append(_link(entry))
    if not able:
        sentences.append(
            f"not proven: the {found.device_type} device takes no host kernels ({why}), so "
            f"{_op(entry)} cannot be put on the host and the run replayed without it"
        )
        return _ended(proof, "no host kernels")
    names: list[str] = []
    while True:
        name, refused = _host_name(entry)
        if name is None:
            sentences.append(
                f"not proven: {_op(entry)} cannot run on the host ({refused}), so no rerun can "
                "show the model right without it"
            )
            return _ended(proof, "refused")
        names.append(name)
        proof["chain"][-1]["on_host"] = name
        try:
            again, calls = rerun(list(names))
        # a kernel already registered for it, say
        except (host_ops.HostOpsRefused, RuntimeError) as exc:
            sentences.append(f"not proven: {_listed(names)} could not be put on the host: {exc}")
            return _ended(proof, "refused")
        proof["on_host"] = list(names)
        proof["reruns"].append(_rerun_of(names, again, calls))
        hosted = f"with {_listed(names)} on the host"
        following = again.first
        if following is None:
            return _ended(proof, *_last_rerun(again, hosted, calls, sentences))
        # hosted, and still wrong: the device never called the kernel
        if _host_name(following)[0] in names:
            sentences.append(
                f"not proven: {hosted} the run still goes wrong at {_op(following)}: the "
                f"{found.device_type} device did not run its host kernel"
            )
            return _ended(proof, "not taken")
        proof["chain"].append(_link(following))
        sentences.append(
            f"not enough: {hosted} {_still(following, again)}; the next wrong operator is "
            f"{operator_words(following)}, max rel error {following['max_rel_error']:.3g}"
        )
        if len(names) >= MAX_ON_HOST:
            sentences.append(
                f"the proof stops at its bound of {MAX_ON_HOST} operators on the host: "
                f"{_op(following)} is named, not proven"
            )
            return _ended(proof, "bound")
        entry = following


def _still(entry: dict, again: Localised) -> str:
    """Where a rerun still goes wrong: ``the forward still diverges at operator #125 of 263``
    (one forward), ``the run still goes wrong at step 3 (a decode step over 38 positions),
    operator #40 of that step's forward``."""
    if again.replay is None or entry.get("step") is None:
        return (
            f"the forward still diverges at operator #{entry['index'] + 1} of "
            f"{again.checked + again.not_judged}"
        )
    return (
        f"the run still goes wrong{step_words(entry, again)}, at operator "
        f"#{entry.get('step_index', entry['index']) + 1} of that step's forward"
    )


def _op(entry: dict) -> str:
    """A wrong operator as the census and the plan name it: ``aten::rsqrt``,
    ``aten::mul.Tensor``."""
    return localised_answers.op_name(entry["operator"], entry.get("overload"))


def _listed(names: list[str]) -> str:
    """``aten::mul``, ``aten::mul and aten::silu``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _link(entry: dict) -> dict:
    """A wrong operator of the proof's chain, as stored (``on_host``: the name it went to the
    host as)."""
    keys = ("operator", "overload", "module", "module_class", "index", "step", "max_rel_error")
    return {"name": _op(entry), **{key: entry.get(key) for key in keys}, "on_host": None}


def _host_name(entry: dict) -> tuple[str | None, str | None]:
    """(the name a wrong operator goes to the host as, None) or (None, why it cannot go). Its
    whole packet (``aten::mul``: a stack's kernel is rarely wrong in one form only) when the
    packet goes, else its own overload; refused when its own overload is."""
    operator, overload = (
        entry["operator"],
        entry.get("overload") or localised_answers.DEFAULT_OVERLOAD,
    )
    own = f"{operator}.{overload}"
    refused = host_ops.refusals([own])
    if refused:
        return None, refused[own]
    return (own if host_ops.refusals([operator]) else operator), None


def _rerun_of(names: list[str], again: Localised, calls: dict) -> dict:
    """One rerun of the proof, as stored."""
    following = again.first
    failure = again.forward_failure
    keys = ("operator", "overload", "module", "index", "step", "max_rel_error")
    return {
        "on_host": list(names),
        "ops_checked": again.checked,
        "ops_wrong": again.flagged,
        "ops_not_judged": again.not_judged,
        "steps_run": again.steps_run,
        "next": {key: following.get(key) for key in keys} if following else None,
        "numerics": (again.numerics or {}).get("numerics"),
        "numerics_note": (again.numerics or {}).get("numerics_note") or again.numerics_why,
        "forward_failure": {
            key: failure.get(key) for key in ("error_type", "module", "error_message")
        }
        if failure
        else None,
        "host_calls": dict(calls),
        "seconds": again.seconds,
    }


def _steps(found: Localised) -> str:
    """The steps a rerun's output was judged over: ``at each of the 8 steps of the run``, ``at
    the run's one step``, ``at each of the 40 positions of the long text's decode path``."""
    n = len(found.scores) or found.steps_run
    replay = found.replay or Replay()
    return (
        f"at {replay.what}'s one {replay.unit}"
        if n == 1
        else f"at each of the {n} {replay.unit}s of {replay.what}"
    )


def _last_rerun(
    again: Localised, hosted: str, calls: dict, sentences: list[str]
) -> tuple[str, bool]:
    """The sentence of a rerun that found no wrong operator, and (verdict, matches). Raised: the
    run did not reach its end. Else the one judgement ``ops --prove`` gives a what-if run
    (``ops.proof.rerun_wrong``): confirmed when its output matches the CPU reference over every
    step it ran (and the replay reached every divergence the record names); operators that could
    not be judged are said, not counted as agreeing."""
    failure = again.forward_failure
    if failure:
        sentences.append(
            f"not proven: {hosted} no operator is wrong, but the run raised "
            f"{failure['error_type']} in {failure['module'] or ROOT_LABEL}, so the model does "
            "not run to its end"
        )
        return "raised", False
    numerics = again.numerics or {}
    judged = (
        f"{again.checked} operators judged"
        if again.not_judged
        else f"all {again.checked} operators"
    )
    unjudged = ""
    if again.not_judged:
        first = again.unjudged[0]
        unjudged = (
            f"; {again.not_judged} of the {again.checked + again.not_judged} operators could "
            f"not be judged (the first: {operator_words(first)}: {first['reason']})"
        )
    why = proof_judgement.rerun_wrong(True, numerics.get("numerics"))
    if why is not None:
        detail = numerics.get("numerics_note") or again.numerics_why
        sentences.append(
            f"not confirmed: {hosted} no operator judged is wrong, but "
            f"{why}{f' ({detail})' if detail else ''}{unjudged}"
        )
        return "not confirmed", False
    unreached = again.replay.unreached if again.replay is not None else None
    if unreached:
        sentences.append(
            f"not proven: {hosted} the replayed run matches the reference, but "
            f"{unreached}{unjudged}"
        )
        return "not reached", False
    ran = sum(calls.values())
    replay, n = again.replay, again.steps_run
    scope = "it ran"
    if replay is not None and replay.check_from:
        c = min(replay.check_from, n)
        scope = f"its {replay.unit}s {c}-{n - 1} ran (the {c} before ran unchecked)"
    sentences.append(
        f"confirmed: {hosted} the model matches the reference: its output agrees with the CPU "
        f"reference {_steps(again)} (numerics {numerics.get('numerics')}), {judged} {scope} on "
        f"{again.device_type} agree with the CPU's replay from the same inputs{unjudged}, "
        f"nothing raised ({ran} call{'' if ran == 1 else 's'} on the host)"
    )
    return "confirmed", True


def _ended(proof: dict, verdict: str, matches: bool = False) -> dict:
    proof.update(verdict=verdict, matches=matches)
    return proof
