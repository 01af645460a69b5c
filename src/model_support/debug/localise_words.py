"""What the localiser found, in words and HTML: the one-line summary, the proof's lines, the
command's answer, the debug notebook's table (``localise``'s module docstring says what is
found)."""

from __future__ import annotations

from . import op_check
from .findings import Localised
from .tracer import ROOT_LABEL


def operator_words(entry: dict) -> str:
    """An operator of the finding as a reader finds it: ``aten::bmm (default) in
    model.layers.0.self_attn (...)``."""
    where = f" ({entry['module_class']})" if entry.get("module_class") else ""
    return f"{entry['operator']} ({entry['overload']}) in {entry['module']}{where}"


def _operators(count: int) -> str:
    """``1 operator``, ``2 operators``: a count in a sentence."""
    return f"{count} operator{'' if count == 1 else 's'}"


def _scope(found: Localised) -> str:
    """What ran, as the subject of "ran on the device": ``the forward`` (``localise_forward``),
    ``the prompt's forward``, ``the run's 4 forwards (the prompt's, then 3 decode steps through
    the KV cache; steps 0-3 of its 8)``, ``the long text's 40 decode steps through the KV cache
    (positions 36-39 checked; the 36 before ran unchecked, ...)``."""
    replay = found.replay
    if replay is None:
        return "the forward"
    n, total, unit = found.steps_run, replay.steps, replay.unit
    if replay.prompt_ids is not None and not replay.tokens:
        return f"the forward over the long text's first {len(replay.prompt_ids)} positions"
    if replay.prompt_ids is not None:
        c = min(replay.check_from, n)
        checked = (
            f"{unit}s {c}-{n - 1} checked; the {c} before ran unchecked, filling the cache as "
            "the check's did"
            if c
            else "every one checked"
        )
        return f"{n} decode steps of {replay.what} through the KV cache ({checked})"
    of = f"{unit} 0 of the run's {total}" if n == 1 else f"{unit}s 0-{n - 1} of its {total}"
    if n == 1:
        return f"the prompt's forward{f' ({of})' if total > 1 else ''}"
    decode = f"{n - 1} decode step{'' if n == 2 else 's'} through the KV cache"
    return f"the run's {n} forwards (the prompt's, then {decode}{'; ' + of if n < total else ''})"


def step_words(entry: dict, found: Localised) -> str:
    """Where in the run an operator ran: `` at step 3 (a decode step over 29 positions; the run
    diverged from the CPU reference there)``; empty for one forward (``localise_forward``)."""
    replay = found.replay
    if replay is None or entry.get("step") is None:
        return ""
    step, unit = entry["step"], replay.unit
    if step:
        what = "a decode step"
    else:
        what = "the prompt's forward" if replay.prompt_ids is None else "the forward over the text"
    positions = f" over {found.tokens_in + step} positions" if found.tokens_in else ""
    there = ""
    if replay.diverged_at is not None:
        there = (
            f"; {replay.how} "
            f"{'there' if replay.diverged_at == step else f'at {unit} {replay.diverged_at}'}"
        )
    return f" at {unit} {step} ({what}{positions}{there})"


def _reached(found: Localised) -> str:
    """For a replay with no wrong operator: whether it reached the step where the run went wrong,
    and what it could not reach ("" for none, or one forward)."""
    replay = found.replay
    if replay is None:
        return ""
    said = ""
    if replay.diverged_at is not None:
        last, unit = found.steps_run - 1, replay.unit
        reach = (
            "which the replay reached"
            if last >= replay.diverged_at
            else f"which the replay did not reach (it stopped at {unit} {last})"
        )
        how = replay.how or "the run went wrong"
        said = f" {how[0].upper()}{how[1:]} at {unit} {replay.diverged_at}, {reach}."
    if replay.unreached:
        said += f" Not reached: {replay.unreached}."
    return said


def _output(found: Localised) -> str:
    """The replayed run's output against the CPU reference, as a sentence ("" where it was not
    judged)."""
    numerics = found.numerics
    if not numerics or not numerics.get("numerics"):
        return ""
    verdict = numerics["numerics"]
    note = f" ({numerics['numerics_note']})" if numerics.get("numerics_note") else ""
    if verdict == "match":
        return (
            " Replayed so, its output agrees with the CPU reference at every step (numerics "
            f"{verdict})."
        )
    return (
        " Replayed so, its output does not agree with the CPU reference all the same: numerics "
        f"{verdict}{note}."
    )


def summary(found: Localised, dtype: str | None = None) -> str:
    """The finding in a sentence or two: the first wrong operator and the step it ran in, or what
    the replay ran and how far it reached; never a failure that was not found, and never "all
    agree" over operators that were not judged: those are said first when they ran before the
    first wrong one."""
    first = found.first
    if found.device_type == "cpu":
        return (
            "The model ran on the CPU: there is no device to compare with the CPU, so no operator "
            "was checked."
        )
    raised = found.forward_failure
    tail = (
        f"; the forward then raised {raised['error_type']} in {raised['module'] or ROOT_LABEL}"
        if raised
        else ""
    )
    within = f"within the tolerance{' of ' + dtype if dtype else ''}"
    outputs = _outputs_note(found)
    scope = _scope(found)
    if first is None and not found.not_judged:
        return (
            f"No operator is wrong: all {found.checked} operators {scope} ran on "
            f"{found.device_type} agree with the CPU's replay from the same inputs "
            f"{within}{tail}.{outputs}{_reached(found)}{_output(found)}"
        )
    if first is None:
        unjudged = found.unjudged[0]
        return (
            f"Not every operator was judged: {found.not_judged} of the "
            f"{found.checked + found.not_judged} operators {scope} ran on {found.device_type} "
            "could not be replayed on the CPU, so nothing here says whether they are right "
            f"(the first: {operator_words(unjudged)}: {unjudged['reason']}); the other "
            f"{found.checked} agree with the CPU's replay from the same inputs "
            f"{within}{tail}.{outputs}{_reached(found)}{_output(found)}"
        )
    before = first.get("not_judged_before", 0)
    lead = ""
    if before:
        unjudged = found.unjudged[0]
        lead = (
            f"{_operators(before)} before the first wrong one could not be judged "
            f"({operator_words(unjudged)}{' and others' if before > 1 else ''}: "
            f"{unjudged['reason']}), so the numbers may already go wrong there. "
        )
    after = found.not_judged - before
    ran = "" if found.replay is None else f" Checked: {scope}."
    return (
        lead + f"The first wrong operator of {found.checked} checked is "
        f"{operator_words(first)}{',' if found.replay else ''}{step_words(first, found)}: max "
        f"abs error {first['max_abs_error']:.3g}, max rel error {first['max_rel_error']:.3g} "
        f"({first['reason']}){tail}."
        + (f" {_operators(after)} after it could not be judged." if after else "")
        + ran
        + outputs
    )


def _outputs_note(found: Localised) -> str:
    """The outputs of judged operators that were not compared, as a sentence (empty when there
    are none)."""
    if not found.outputs_not_judged:
        return ""
    parts = [f"{name}'s {note['reason']}" for name, note in found.outputs_not_judged.items()]
    return f" Outputs not judged: {'; '.join(parts)}."


def proof_lines(proof: dict | None) -> list[str]:
    """The proof as the command prints it: one line a sentence, in the order they happened."""
    return [f"{sentence}." for sentence in (proof or {}).get("sentences", [])]


def answer_lines(result: dict) -> list[str]:
    """What ``model-support localise`` prints for a stored result: the stack's sentence (when
    this stack is not the sweep's), the finding, the first wrong operator's script, then the
    proof."""
    lines = [result["stack_note"]] if result.get("stack_note") else []
    lines.append(result["summary"])
    if result.get("repro"):
        lines.append(
            f"repro: python {result['repro']}  (input shapes {result['shapes']}, dtypes "
            f"{result['dtypes']})"
        )
    return lines + proof_lines(result.get("proof"))


def localised_html(found: Localised, dtype: str | None = None) -> str:
    """The finding for the debug notebook: the sentence, every flagged operator (the first
    highlighted), then every operator that could not be judged, with why."""
    import html

    from .. import display
    from ..display import Cell, Row

    colour = "#cf222e" if found.first else "#9a6700" if found.not_judged else "#1a7f37"
    parts = [f"<p style='color:{colour}'><b>{html.escape(summary(found, dtype))}</b></p>"]
    columns = ("operator #", "operator", "overload", "module", "shapes", "dtypes")
    if found.wrong:
        rows = (
            Row(
                [*_cells(w), Cell(f"{w['max_abs_error']:.3g}"), Cell(f"{w['max_rel_error']:.3g}")],
                style="background:#ffd7d5;font-weight:bold" if w is found.first else None,
            )
            for w in found.wrong
        )
        parts.append(display.html_table((*columns, "max_abs_error", "max_rel_error"), rows))
    if found.unjudged:
        parts.append(f"<p>Not judged ({found.not_judged}): the CPU could not replay these.</p>")
        rows = (Row([*_cells(u), Cell(u["reason"])]) for u in found.unjudged)
        parts.append(display.html_table((*columns, "why"), rows))
    parts.append(f"<p><small>{html.escape(op_check.tolerance_text())}.</small></p>")
    return "".join(parts)


def _cells(entry: dict) -> list:
    """The cells that name an operator of the finding in the notebook's tables (``columns`` of
    ``localised_html``)."""
    from ..display import Cell

    return [
        Cell(
            entry["index"]
            if entry.get("step") is None
            else f"{entry['index']} (step {entry['step']})"
        ),
        Cell(entry["operator"], code=True),
        Cell(entry["overload"]),
        Cell(entry["module"], code=True),
        Cell(entry["shapes"]),
        Cell(", ".join(entry["dtypes"])),
    ]
