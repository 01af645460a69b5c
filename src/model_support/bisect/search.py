"""The bisect: which package, then which release, changed a row's verdict (docs/bisect.md).

For each row (model, variant) whose verdict differs between sweep A and sweep B:
1. both ends are rerun first, each in an overlay environment (``envs``): B's stack, and B's stack
   with every differing package at A's version. An end whose rerun disagrees with its record is run
   once more: two runs of one environment that disagree make the row *flaky* (not bisected); two
   that agree with each other but not with the record make it *not reproduced* (something the stack
   does not name changed);
2. the package: B's stack with some differing packages at A's version, each swap with the packages a
   version pin ties to them (they move together, and the answer says so): halves first while more
   than two are left, keeping the half that restores A's verdict; a half that gives no verdict (an
   environment that cannot be built or does not import) says nothing about the other half, so the
   search goes on one package at a time; the package named is always one whose own swap was run and
   restored A's verdict;
3. its releases between the two versions (``releases``), binary search, rerunning the repro script
   on each: the last release with A's verdict and the first with B's. A release that cannot be
   installed or imported with the rest of the stack is skipped with the reason (the requirement that
   conflicts, or the installer's or the script's own words), and the search goes on around it; the
   answer says the range it could not split. In the single-record form a ``--from`` release that
   cannot run here is skipped the same way and the search starts at the nearest release that runs.

With ``--metric`` (``Job.metric``: tpot_s, ttft_s or perf_tokens_per_s) the question is speed, not
the verdict: end A runs first and its repeats are the baseline (the repro script times
``Job.repeats`` generations after its PASS, ``reproduce.PERF_VAR``); every later step is labelled
"as A" or "slower" by the perf gate's rule (``analysis.perf.direction``: median worse by more than
the threshold and beyond the repeats' noise, so noise is not a change), and the searches above run
unchanged on those labels.

A step is the repro script in its own process group, timed alone: a Hub model's files are fetched
before the steps (a download is not the script's time), and a step that runs out of time is ended
with every process it started.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .. import backend_env
from ..analysis import perf
from ..probe import provenance
from ..probe.reproduce import PERF_VAR  # what a step tells its repro script: keep, time
from ..record import schema
from .answers import (
    AS_A,
    FLAKY,
    FOUND,
    NO_PACKAGE,
    NOT_REPRODUCED,
    SAME,
    SETTING,
    SLOWER,
    blank,
    troubled,
)
from .envs import InstallError, Overlays, conflicts, locked
from .releases import Release, between, releases_of
from .results import NOT_RUN
from .stacks import NOT_SWAPPED, Change, Row, SettingChange
from .steps import run_repro, step_env


def split(
    inner: list[Release], verdict_a: str | None, attempt: Callable[[str], str | None]
) -> tuple[int, int, dict]:
    """Binary search over ``inner`` (the releases strictly between A's end, index -1, and B's,
    index len(inner)): ``attempt(version)`` gives the verdict there or raises ``InstallError``.
    Returns (lo, hi, skipped): lo the last index with A's verdict, hi the first without, skipped
    {index: reason} (known before, or found when installing); a skipped release between lo and hi
    is the range not split."""
    lo, hi = -1, len(inner)
    skipped = {i: r.skip for i, r in enumerate(inner) if r.skip}
    while True:
        untried = [i for i in range(lo + 1, hi) if i not in skipped]
        if not untried:
            return lo, hi, skipped
        middle = (lo + hi) / 2
        i = min(untried, key=lambda j: (abs(j - middle), j))
        try:
            verdict = attempt(inner[i].version)
        except InstallError as exc:
            skipped[i] = str(exc)
            continue
        if verdict is None:
            skipped[i] = "the repro script gave no verdict there"
        elif verdict == verdict_a:
            lo = i
        else:
            hi = i


@dataclass
class Job:
    """One row to bisect, with the stacks around it."""

    row: Row
    stack_a: dict[str, str]
    stack_b: dict[str, str]
    #: The packages that may have done it (differing between the stacks), or the one named.
    candidates: list[Change]
    steps: list[dict] = field(default_factory=list)
    #: The backend's configuration at each end (``sweep.json``'s ``device_config``), None where not
    #: recorded.
    settings_a: dict[str, str] | None = None
    settings_b: dict[str, str] | None = None
    #: ``bisect --metric``: the metric (an ``analysis.perf.METRICS`` name), its threshold, the
    #: repeats each step times, and end A's repeats once run (the baseline every later step is
    #: labelled against).
    metric: str | None = None
    threshold: float = perf.DEFAULT_THRESHOLD
    repeats: int = 3
    baseline: list[float] | None = None

    def label(self, verdict: str | None, said: dict) -> tuple[str | None, dict, str | None]:
        """A step of ``--metric`` in the search's terms: (label, what the step keeps of its
        timing, a note where there is no label). Not a PASS: its verdict (a third one); a PASS
        without timing: no label; the first timed PASS (end A) is the baseline, "as A"; later
        ones "slower" or "as A" (``perf.direction``)."""
        if verdict != schema.PASS:
            return verdict, {}, None
        repeats_key, more_is_better = perf.METRICS[self.metric or ""]
        values = [v for v in ((said.get("perf") or {}).get(repeats_key) or []) if v is not None]
        if not values:
            return (
                None,
                {},
                "the repro script printed no timing "
                f"({said.get('perf_note') or 'no perf in its line'})",
            )
        timing = {"median": statistics.median(values), "repeats": values}
        if self.baseline is None:
            self.baseline = values
            return AS_A, timing, None
        base = self.baseline
        moved = perf.direction(base, values, more_is_better, self.threshold)
        return (SLOWER if moved == "slower" else AS_A), timing, None

    def setting_changes(self) -> list[SettingChange]:
        """The backend settings that differ between the ends (none when either is not recorded)."""
        if self.settings_a is None or self.settings_b is None:
            return []
        a, b = self.settings_a, self.settings_b
        return [
            SettingChange(n, a.get(n), b.get(n))
            for n in sorted(set(a) | set(b))
            if a.get(n) != b.get(n)
        ]

    def env(self, end: str) -> dict[str, str] | None:
        """The environment of a step standing for ``end`` ("a" or "b"): its backend
        configuration."""
        settings = self.settings_a if end == "a" else self.settings_b
        return step_env(settings, set(self.settings_a or {}) | set(self.settings_b or {}))


class Bisector:
    """Runs jobs (several at once): environments from ``overlays``, releases from the same source
    (its wheelhouse, or the index pip is configured with)."""

    def __init__(self, overlays: Overlays, *, pre: bool = False, yanked: bool = False):
        self.overlays = overlays
        self.pre, self.yanked = pre, yanked
        self.base = provenance.stack()
        self._releases: dict[str, list[Release]] = {}
        self._guard = threading.Lock()

    # -- environments ------------------------------------------------------------------------
    def pins_for(self, stack: dict[str, str]) -> dict[str, str]:
        """The overlay that turns this environment into ``stack``: every distribution whose
        version differs."""
        return {n: v for n, v in stack.items() if self.base.get(n) != v and n not in NOT_SWAPPED}

    def with_version(self, pins: dict[str, str], name: str, version: str | None) -> dict[str, str]:
        out = {n: v for n, v in pins.items() if n != name}
        if version is None:
            if name in self.base:
                raise InstallError(f"{name} cannot be taken out: the project's environment has it")
        elif self.base.get(name) != version:
            out[name] = version
        return out

    def _conflicts(self, pins: dict[str, str]) -> list:
        """The requirements ``pins`` break here (this project's own requirements left out: a
        repro script imports nothing of it)."""
        layers = {n: self.overlays.layer(n, v) for n, v in pins.items()}
        return [c for c in conflicts(self.base, pins, layers) if c.requirer not in NOT_SWAPPED]

    def closure(
        self, pins: dict, moved: list[str], names: dict[str, Change]
    ) -> tuple[dict, list[str]]:
        """``pins`` with every candidate a version pin ties to a ``moved`` package (or to one
        moved with it) moved to A's version too, as single swaps and halves both need: (the pins,
        the names moved with them)."""
        moving, together = set(moved), list[str]()
        while True:
            tied = None
            for conflict in self._conflicts(pins):
                for mine, other in (
                    (conflict.requirer, conflict.name),
                    (conflict.name, conflict.requirer),
                ):
                    if mine in moving and other in names and other not in moving:
                        tied = other
                        break
                if tied:
                    break
            if tied is None:
                return pins, together
            moving.add(tied)
            together.append(tied)
            pins = self.with_version(pins, tied, names[tied].before)

    def explain(self, pins: dict[str, str], moved: set[str] | None, note: str | None) -> str:
        """Why a step gave no verdict, in words: the requirements its pins break (those of the
        ``moved`` packages; every one at an end), then what the installer or the script said."""
        try:
            found = [
                c for c in self._conflicts(pins) if moved is None or {c.requirer, c.name} & moved
            ]
        except InstallError:
            found = []
        return "; ".join([*(str(c) for c in found[:2]), note or "no verdict"])

    def run(
        self,
        job: Job,
        step: str,
        pins: dict[str, str],
        package: str | None = None,
        version: str | None = None,
        end: str = "b",
    ):
        """One run of the row's repro script with ``pins`` on this environment and the backend
        configuration of ``end`` (B's but for end A and the setting swap); recorded in job.steps.
        An environment that cannot be built is no verdict (None), with the reason in the step's
        note."""
        started = time.monotonic()
        entry = {"step": step, "package": package, "version": version, "verdict": None}
        try:
            python = self.overlays.python(pins)
        except InstallError as exc:
            job.steps.append(
                {**entry, "note": str(exc), "env_s": round(time.monotonic() - started, 2)}
            )
            return None
        script = self._script(job.row.script)
        env = job.env(end)
        if job.metric:  # the script times repeats after its PASS
            env = {
                **(backend_env.child_environ() if env is None else env),
                PERF_VAR: str(job.repeats),
            }
        ready = time.monotonic()
        verdict, note, said = run_repro(
            python, script, job.row.args, job.row.timeout_s, script.parent, env
        )
        seconds = round(time.monotonic() - ready, 2)  # the repro script's run
        if job.metric and verdict is not None:
            entry["ran"] = verdict  # the script's own verdict, beside the label
            verdict, timing, why = job.label(verdict, said)
            entry.update(timing)
            note = why or note
        if verdict is None:
            moved = None if package is None or version is None else {package}
            note = self.explain(pins, moved, note)
        job.steps.append(
            {
                **entry,
                "verdict": verdict,
                "note": note,
                "seconds": seconds,
                "env_s": round(ready - started, 2),
            }
        )
        return verdict

    def _script(self, text: str) -> Path:
        """The script's file in the cache (absolute, one per text), written once under its lock."""
        path = (
            self.overlays.cache / "scripts" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
        )
        with locked(self.overlays.cache / "locks" / f"script-{path.stem}.lock"):
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        return path

    def releases(self, name: str) -> list[Release]:
        """``name``'s releases from the overlays' source, listed once per bisect."""
        with self._guard:
            if name not in self._releases:
                self._releases[name] = releases_of(name, self.overlays.source)
            return self._releases[name]

    def fetch(self, job: Job) -> None:
        """A Hub model's files, downloaded before its first step and handed to every step as the
        folder to load (the script then downloads nothing): a step's timeout is the script's run,
        not the download."""
        hub = job.row.hub
        if not hub or job.row.args:
            return
        from ..probe import hub_fetch

        got = hub_fetch.fetch(
            hub["model_id"],
            hub.get("revision") or "",
            trust_remote_code=bool(hub.get("trust_remote_code")),
            log=lambda line: None,
        )
        job.row.args = [got["path"]]

    # -- one row -----------------------------------------------------------------------------
    def end(
        self, job: Job, label: str, pins: dict[str, str], recorded: str | None
    ) -> tuple[str | None, str | None]:
        """(verdict, trouble) of an end, rerun; trouble is FLAKY or NOT_REPRODUCED when it
        disagrees."""
        side = "a" if label == "end A" else "b"
        first = self.run(job, label, pins, end=side)
        if first is None or recorded is None or first == recorded:
            return first, None
        second = self.run(job, label + " (again)", pins, end=side)
        return first, FLAKY if second != first else NOT_REPRODUCED

    def bisect(self, job: Job) -> dict:
        """The row's answer; an unexpected exception is an answer too (``could not run``, naming
        it), so one row's trouble never loses the others'."""
        started = time.monotonic()
        try:
            answer = self._bisect(job)
        except Exception as exc:  # noqa: BLE001 - the other rows' answers are kept; this one says what stopped it
            answer = {
                **blank(job.row),
                "status": NOT_RUN,
                "note": f"the bisect stopped: {type(exc).__name__}: {exc}",
            }
        answer.update(
            note=answer["note"].strip().rstrip(";"),
            model_id=job.row.model_id,
            variant=job.row.variant,
            steps=job.steps,
            installer=self.overlays.tool,
            seconds=round(time.monotonic() - started, 2),
        )
        return answer

    def _bisect(self, job: Job) -> dict:
        row = job.row
        out = blank(row)
        if not job.candidates and not job.setting_changes():
            return {
                **out,
                "status": NO_PACKAGE,
                "note": "no package version or backend setting differs between the two stacks",
            }
        try:
            self.fetch(job)
        except Exception as exc:  # noqa: BLE001 - hub_fetch's own exceptions name what went wrong
            return {
                **out,
                "status": NOT_RUN,
                "note": f"the model's files could not be fetched: {exc}",
            }
        try:
            pins_b = self.pins_for(job.stack_b)
            pins_a = pins_b
            for change in job.candidates:
                # A lacked it; an overlay cannot take it out
                if change.before is None and change.name in self.base:
                    out["note"] += f"{change.name} (not in A's stack) stays installed at end A; "
                    continue
                pins_a = self.with_version(pins_a, change.name, change.before)
        except InstallError as exc:
            return {**out, "status": NOT_RUN, "note": str(exc)}
        # end A first: its repeats are the baseline every later step is labelled against
        if job.metric:
            out.update(metric=job.metric, threshold=job.threshold)
            if self.run(job, "end A", pins_a, end="a") != AS_A:
                said = job.steps[-1].get("note") or f"gave {job.steps[-1].get('ran')}"
                return {
                    **out,
                    "status": NOT_RUN,
                    "note": out["note"] + f"A's stack gave no timing here ({said})",
                }
            out["before"] = job.steps[-1]["median"]
        verdict_b, trouble_b = self.end(job, "end B", pins_b, row.verdict_b)
        if job.metric:
            out["after"] = job.steps[-1].get("median")
        if verdict_b is None:
            said = f"B's stack gave no verdict here ({job.steps[-1]['note']}): not bisected"
            return {**out, "status": NOT_RUN, "note": out["note"] + said}
        verdict_a: str | None
        trouble_a: str | None
        if job.metric:
            verdict_a, trouble_a = AS_A, None  # run first, above
        elif self.narrows(job):
            verdict_a, trouble_a = self.start(job, pins_b, out), None
            if verdict_a is None:
                return {**out, "status": NOT_RUN}
            pins_a = self.with_version(pins_b, job.candidates[0].name, job.candidates[0].before)
        else:
            verdict_a, trouble_a = self.end(job, "end A", pins_a, row.verdict_a)
            if verdict_a is None:
                said = f"A's stack gave no verdict here ({job.steps[-1]['note']}): not bisected"
                return {**out, "status": NOT_RUN, "note": out["note"] + said}
        ended = troubled(row, out, (verdict_a, trouble_a), (verdict_b, trouble_b))
        if ended is not None:
            return ended
        # the records' (reran); --from's in the single form
        out.update(verdict_a=verdict_a, verdict_b=verdict_b)
        if verdict_a == verdict_b:
            return {**out, "status": SAME, "note": out["note"] + f"{verdict_a} at both ends"}
        by_setting = self._by_setting(job, pins_b, verdict_a, out)
        if by_setting is not None:
            return by_setting
        change, pins_swap, together = self.find_package(job, pins_b, pins_a, verdict_a)
        if change is None:
            tried = ", ".join(c.name for c in job.candidates)
            return {
                **out,
                "status": NO_PACKAGE,
                "note": out["note"] + f"no single swap restores {verdict_a} (tried {tried})",
            }
        out.update(package=change.name, together=together)
        if together:
            out["note"] += (
                f"{change.name} and {', '.join(together)} must move together (a version pin "
                "between them). "
            )
        self.search(job, change, pins_swap, verdict_a, verdict_b, out)
        return out

    def _by_setting(self, job: Job, pins_b, verdict_a: str, out: dict) -> dict | None:
        """B's packages with A's backend configuration: the answer when that gives A's verdict
        back (a setting changed it), or when no package differs either; None: the packages are
        bisected."""
        settings = job.setting_changes()
        if not settings:
            return None
        if self.run(job, "A's settings", pins_b, end="a") == verdict_a:
            shown = "; ".join(str(s) for s in settings)
            return {
                **out,
                "status": SETTING,
                "setting": [
                    {"name": s.name, "before": s.before, "after": s.after} for s in settings
                ],
                "note": out["note"]
                + f"B's packages with A's backend settings give {verdict_a}: changed by {shown}",
            }
        if not job.candidates:
            return {
                **out,
                "status": NO_PACKAGE,
                "note": out["note"]
                + f"A's backend settings with B's packages do not restore {verdict_a}",
            }
        return None

    @staticmethod
    def narrows(job: Job) -> bool:
        """The single-record form (one package, ``--from``'s verdict unknown until it runs): a
        ``--from`` release that cannot run here is skipped, not the end of the bisect."""
        if not job.candidates:
            return False
        (change, *more) = job.candidates
        return (
            not more
            and job.row.verdict_a is None
            and change.before is not None
            and change.after is not None
        )

    def start(self, job: Job, pins_b: dict, out: dict) -> str | None:
        """End A of the single-record form: ``--from``'s verdict; where it cannot run with this
        stack, the verdict of the nearest release toward B's that runs, which becomes the start
        (job.candidates says so), each release passed over in ``out["skipped"]`` with its reason.
        None when none runs (the note says why)."""
        change = job.candidates[0]
        start, end = change.before, change.after
        assert start is not None and end is not None  # narrows() said so
        try:
            inner = between(
                self.releases(change.name), start, end, pre=self.pre, yanked=self.yanked
            )
        except OSError:
            inner = []
        passed: list[dict] = []
        for release in [Release(start), *inner]:
            try:
                if release.skip:
                    raise InstallError(release.skip)
                verdict = self.attempt(job, change.name, pins_b, release.version, "end A")
            except InstallError as exc:
                passed.append({"version": release.version, "reason": str(exc)})
                continue
            out["skipped"] += passed
            if passed:
                job.candidates = [Change(change.name, release.version, change.after)]
                out["note"] += (
                    f"{change.name} {change.before} (--from) cannot run with this stack (see "
                    f"skipped): skipped, and the search starts at {release.version}, the "
                    "nearest release that runs. "
                )
            return verdict
        out["skipped"] += passed
        out["note"] += (
            f"no release of {change.name} from {change.before} to {change.after} runs with "
            f"this stack ({passed[0]['reason']}): not bisected"
        )
        return None

    def attempt(
        self, job: Job, name: str, pins_swap: dict, version: str, step: str = "bisect"
    ) -> str:
        """The verdict with ``name`` at ``version`` over ``pins_swap``; ``InstallError`` naming
        the release and why when it cannot run with the rest of the stack (a requirement it or
        the stack breaks: not run; an environment that cannot be built, or a script that gave no
        verdict there)."""
        pins = self.with_version(pins_swap, name, version)
        found = [str(c) for c in self._conflicts(pins) if name in (c.name, c.requirer)]
        if found:
            job.steps.append(
                {
                    "step": step,
                    "package": name,
                    "version": version,
                    "verdict": None,
                    "note": found[0],
                }
            )
            raise InstallError(f"{name} {version} cannot run with this stack: {found[0]}")
        verdict = self.run(job, step, pins, name, version)
        if verdict is None:
            raise InstallError(
                f"{name} {version} gave no verdict with this stack ({job.steps[-1]['note']})"
            )
        return verdict

    def swap(self, job: Job, pins_b: dict, group: list[Change], names: dict[str, Change]):
        """B's stack with ``group`` (and what a pin ties to it) at A's versions: (verdict, pins,
        the names moved with it); verdict None when it cannot be built or gives no verdict
        (inconclusive)."""
        try:
            pins = pins_b
            for change in group:
                pins = self.with_version(pins, change.name, change.before)
            pins, together = self.closure(pins, [c.name for c in group], names)
        except InstallError as exc:
            label = ", ".join(c.name for c in group)
            job.steps.append(
                {
                    "step": "swap",
                    "package": label,
                    "version": None,
                    "verdict": None,
                    "note": str(exc),
                }
            )
            return None, pins_b, []
        label = ", ".join(c.name for c in group) + (
            f" (with {', '.join(together)})" if together else ""
        )
        version = group[0].before if len(group) == 1 and not together else None
        return (
            self.run(job, "swap", pins, label if version is None else group[0].name, version),
            pins,
            together,
        )

    def find_package(self, job: Job, pins_b: dict, pins_a: dict, verdict_a: str):
        """The candidate whose swap (with what a pin ties it to) restores A's verdict: (change,
        its pins with the package at A's version, the packages moved with it); (None, {}, [])
        when none does.

        Halves first while more than two are left (log2(n) runs, not n): a half that restores A's
        verdict holds the culprit; one that gives another verdict does not; one that gives none
        (inconclusive) ends the halving, and the packages left are swapped one by one. Every
        package named had its own swap run, and it restored A's verdict."""
        if len(job.candidates) == 1:  # the swap is end A
            return job.candidates[0], pins_a, []
        names = {c.name: c for c in job.candidates}
        group = list(job.candidates)
        while len(group) > 2:
            half = group[: len(group) // 2]
            verdict, pins, together = self.swap(job, pins_b, half, names)
            if verdict is None:
                job.steps[-1]["note"] = (
                    f"{job.steps[-1]['note']} (inconclusive: one by one instead)"
                )
                break
            swapped = {c.name for c in half} | set(together)
            if verdict == verdict_a and len(swapped) == 1:  # that swap was this one package alone
                return half[0], pins, []
            kept = (
                [c for c in job.candidates if c.name in swapped]
                if verdict == verdict_a
                else [c for c in group if c.name not in swapped]
            )
            if not kept or len(kept) >= len(group):
                break  # a pin tied the half to the rest: nothing learned
            group = kept
        for change in group:  # each alone: the first whose swap restores A's verdict
            verdict, pins, together = self.swap(job, pins_b, [change], names)
            if verdict == verdict_a:
                return change, pins, together
        return None, {}, []

    def search(
        self, job: Job, change: Change, pins_swap: dict, verdict_a: str, verdict_b: str, out: dict
    ) -> None:
        """Binary search of ``change``'s releases between A's version and B's; fills ``out``."""
        start, end = change.before, change.after
        out["verdicts"] = {start: verdict_a, end: verdict_b}
        if start is None or end is None:
            out.update(status=FOUND, last_same=start, first_changed=end)
            out["note"] += f"{change.name} is installed in only one of the two stacks"
            return
        try:
            inner = between(
                self.releases(change.name), start, end, pre=self.pre, yanked=self.yanked
            )
        except OSError as exc:
            inner = []
            out["note"] += f"its releases could not be listed from {self.overlays.source} ({exc}); "

        def attempt(version: str) -> str:
            verdict = self.attempt(job, change.name, pins_swap, version)
            out["verdicts"][version] = verdict
            return verdict

        lo, hi, skipped = split(inner, verdict_a, attempt)
        versions = [start, *(r.version for r in inner), end]
        out.update(status=FOUND, last_same=versions[lo + 1], first_changed=versions[hi + 1])
        out["skipped"] += [
            {"version": inner[i].version, "reason": reason} for i, reason in sorted(skipped.items())
        ]
        inside = [inner[i].version for i in sorted(skipped) if lo < i < hi]
        if inside:
            out["unsplit"] = [versions[lo + 1], versions[hi + 1]]
            out["note"] += (
                f"the range {versions[lo + 1]}..{versions[hi + 1]} could not be split: "
                f"{', '.join(inside)} could not run here (skipped: see skipped)"
            )
        elif skipped:
            out["note"] += (
                f"{len(skipped)} release(s) that could not run here skipped (see skipped); the "
                "search went on around them"
            )
        third = {v for v in out["verdicts"].values() if v not in (verdict_a, verdict_b)}
        if third:
            out["note"] += (
                f"; some releases gave a third verdict ({', '.join(sorted(map(str, third)))})"
            )

    def bisect_all(
        self,
        jobs: list[Job],
        workers: int = 1,
        log: Callable[[str], None] | None = None,
        on_answer: Callable[[dict], None] | None = None,
    ) -> list[dict]:
        """Every job's answer, in the jobs' order; ``workers`` rows at once. ``on_answer`` gets
        each answer as its row finishes (in this thread: the caller stores it then, so a later
        row's trouble loses nothing already answered)."""
        answers: dict[int, dict] = {}
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = {pool.submit(self.bisect, job): i for i, job in enumerate(jobs)}
            for future in as_completed(futures):
                answer = future.result()
                answers[futures[future]] = answer
                if on_answer:
                    on_answer(answer)
                if log:
                    log(
                        f"bisected {answer['model_id']} [{answer['variant']}]: "
                        f"{answer['status']}, {answer['seconds']:.0f} s"
                    )
        return [answers[i] for i in range(len(jobs))]
