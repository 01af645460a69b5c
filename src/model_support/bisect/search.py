"""The bisect: which package, then which release, changed a row's verdict (docs/bisect.md).

For each row (model, variant) whose verdict differs between sweep A and sweep B:
1. both ends are rerun first, each in an overlay environment (``envs``): B's stack, and B's stack with
   every differing package at A's version. An end whose rerun disagrees with its record is run once more:
   two runs of one environment that disagree make the row *flaky* (not bisected); two that agree with each
   other but not with the record make it *not reproduced* (something the stack does not name changed);
2. the package: B's stack with one differing package at A's version (and any package a version pin ties
   it to: they move together, and the answer says so); the one whose swap restores A's verdict is it;
3. its releases between the two versions (``releases``), binary search, rerunning the repro script on
   each: the last release with A's verdict and the first with B's. A release that cannot be installed
   here is skipped with its reason; the answer says the range it could not split.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..probe import provenance
from ..record import schema
from .envs import InstallError, Overlays, conflicts
from .releases import Release, between, releases_of
from .stacks import NOT_SWAPPED, Change, Row

FOUND, FLAKY, NOT_REPRODUCED, NO_PACKAGE, NOT_RUN, SAME = (
    "found",
    "flaky",
    "not reproduced",
    "no single package",
    "could not run",
    "same verdict",
)
#: What an answer's ``status`` means (docs/bisect.md says the same).
STATUS_HELP = {
    FOUND: "the package and the two releases around the change are named",
    FLAKY: "two runs of the same environment gave different verdicts: not bisected",
    NOT_REPRODUCED: "an end's verdict does not come back when rerun here (the record's environment differs in "
    "something the stack does not name: the device, the host, the model's files)",
    NO_PACKAGE: "no single package's swap restores A's verdict (they may act together)",
    NOT_RUN: "an environment could not be built, or the repro script gave no verdict",
    SAME: "both ends give the same verdict: nothing to bisect",
}


def run_repro(python: Path, script: Path, args: list[str], timeout_s: float) -> tuple[str | None, str | None]:
    """(verdict, note) of one run of a repro script: the status of its JSON line; a timeout or a killed
    process is FAIL(other), as the sweep records them; no JSON line is no verdict (note: why)."""
    try:
        out = subprocess.run([str(python), str(script), *args], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return schema.FAIL_OTHER, f"timed out after {timeout_s:.0f} s"
    for line in reversed(out.stdout.splitlines()):
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict) and said.get("status") in schema.VERDICTS:
            return said["status"], said.get("error_type")
    if out.returncode < 0:
        return schema.FAIL_OTHER, f"killed by signal {-out.returncode}"
    tail = " ".join((out.stderr or "").strip().splitlines()[-2:])[:300]
    return None, f"no verdict (exit status {out.returncode}): {tail}"


def split(inner: list[Release], verdict_a: str | None, attempt: Callable[[str], str | None]) -> tuple[int, int, dict]:
    """Binary search over ``inner`` (the releases strictly between A's end, index -1, and B's, index
    len(inner)): ``attempt(version)`` gives the verdict there or raises ``InstallError``. Returns (lo, hi,
    skipped): lo the last index with A's verdict, hi the first without, skipped {index: reason} (known
    before, or found when installing); a skipped release between lo and hi is the range not split."""
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


class Bisector:
    """Runs jobs (several at once): environments from ``overlays``, releases from the wheelhouse or the index."""

    def __init__(self, overlays: Overlays, *, find_links: Path | None, pre: bool = False, yanked: bool = False):
        self.overlays = overlays
        self.find_links = find_links
        self.pre, self.yanked = pre, yanked
        self.base = provenance.stack()
        self._releases: dict[str, list[Release]] = {}
        self._guard = threading.Lock()

    # -- environments ------------------------------------------------------------------------
    def pins_for(self, stack: dict[str, str]) -> dict[str, str]:
        """The overlay that turns this environment into ``stack``: every distribution whose version differs."""
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
        layers = {n: self.overlays.layer(n, v) for n, v in pins.items()}
        return conflicts(self.base, pins, layers)

    def run(self, job: Job, step: str, pins: dict[str, str], package: str | None = None, version: str | None = None):
        """One run of the row's repro script with ``pins`` on this environment; recorded in job.steps."""
        started = time.monotonic()
        python = self.overlays.python(pins)
        script = self._script(job.row.script)
        ready = time.monotonic()
        verdict, note = run_repro(python, script, job.row.args, job.row.timeout_s)
        job.steps.append(
            {
                "step": step,
                "package": package,
                "version": version,
                "verdict": verdict,
                "note": note,
                "seconds": round(time.monotonic() - ready, 2),  # the repro script's run
                "env_s": round(ready - started, 2),  # building (or finding) its environment
            }
        )
        return verdict

    def _script(self, text: str) -> Path:
        path = self.overlays.cache / "scripts" / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.py"
        with self._guard:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        return path

    def releases(self, name: str) -> list[Release]:
        with self._guard:
            if name not in self._releases:
                self._releases[name] = releases_of(name, self.find_links)
            return self._releases[name]

    # -- one row -----------------------------------------------------------------------------
    def end(self, job: Job, label: str, pins: dict[str, str], recorded: str | None) -> tuple[str | None, str | None]:
        """(verdict, trouble) of an end, rerun; trouble is FLAKY or NOT_REPRODUCED when it disagrees."""
        first = self.run(job, label, pins)
        if first is None or recorded is None or first == recorded:
            return first, None
        second = self.run(job, label + " (again)", pins)
        return first, FLAKY if second != first else NOT_REPRODUCED

    def bisect(self, job: Job) -> dict:
        started = time.monotonic()
        answer = self._bisect(job)
        answer.update(
            model_id=job.row.model_id,
            variant=job.row.variant,
            steps=job.steps,
            seconds=round(time.monotonic() - started, 2),
        )
        return answer

    def _bisect(self, job: Job) -> dict:
        row = job.row
        out: dict = {"status": None, "package": None, "last_same": None, "first_changed": None}
        out.update(verdict_a=row.verdict_a, verdict_b=row.verdict_b, verdicts={}, skipped=[], unsplit=None)
        out.update(together=[], note="")
        if not job.candidates:
            return {**out, "status": NO_PACKAGE, "note": "no package version differs between the two stacks"}
        try:
            pins_b = self.pins_for(job.stack_b)
            pins_a = pins_b
            for change in job.candidates:
                if change.before is None and change.name in self.base:  # A lacked it; an overlay cannot take it out
                    out["note"] += f"{change.name} (not in A's stack) stays installed at end A; "
                    continue
                pins_a = self.with_version(pins_a, change.name, change.before)
            verdict_b, trouble_b = self.end(job, "end B", pins_b, row.verdict_b)
            verdict_a, trouble_a = self.end(job, "end A", pins_a, row.verdict_a)
        except InstallError as exc:
            return {**out, "status": NOT_RUN, "note": str(exc)}
        if verdict_a is None or verdict_b is None:
            return {**out, "status": NOT_RUN, "note": "the repro script gave no verdict at an end (see steps)"}
        if FLAKY in (trouble_a, trouble_b):
            which = "B's" if trouble_b == FLAKY else "A's"
            return {
                **out,
                "status": FLAKY,
                "note": out["note"] + f"two runs of {which} environment gave different verdicts",
            }
        if trouble_a or trouble_b:
            which = "B" if trouble_b else "A"
            recorded = row.verdict_b if trouble_b else row.verdict_a
            got = verdict_b if trouble_b else verdict_a
            return {
                **out,
                "status": NOT_REPRODUCED,
                "note": out["note"] + f"sweep {which} recorded {recorded}; two runs of its stack here give {got}",
            }
        out.update(verdict_a=verdict_a, verdict_b=verdict_b)  # the records' (reran); --from's in the single form
        if verdict_a == verdict_b:
            return {**out, "status": SAME, "note": f"{verdict_a} at both ends"}
        change, pins_swap, together = self.find_package(job, pins_b, pins_a, verdict_a)
        if change is None:
            tried = ", ".join(c.name for c in job.candidates)
            return {**out, "status": NO_PACKAGE, "note": f"no single swap restores {verdict_a} (tried {tried})"}
        out.update(package=change.name, together=together)
        if together:
            out["note"] += f"{change.name} and {', '.join(together)} must move together (a version pin between them). "
        self.search(job, change, pins_swap, verdict_a, verdict_b, out)
        return out

    def find_package(self, job: Job, pins_b: dict, pins_a: dict, verdict_a: str):
        """The candidate whose swap (with what a pin ties it to) restores A's verdict: (change, its pins
        with the package at A's version, the packages moved with it); (None, {}, []) when none does."""
        if len(job.candidates) == 1:  # the swap is end A
            return job.candidates[0], pins_a, []
        names = {c.name: c for c in job.candidates}
        group = list(job.candidates)
        while len(group) > 2:  # halve: swap half of them at once (end A swapped them all): log2(n) runs, not n
            half = group[: len(group) // 2]
            try:
                pins = pins_b
                for change in half:
                    pins = self.with_version(pins, change.name, change.before)
            except InstallError:
                break  # one by one over what is left
            label = ", ".join(c.name for c in half)
            if self.run(job, "swap", pins, label) == verdict_a:
                if len(half) == 1:  # that swap was this one package alone
                    return half[0], pins, []
                group = half
            else:
                group = group[len(group) // 2 :]
        for change in group:  # each alone: the one whose swap restores A's verdict
            try:
                pins = self.with_version(pins_b, change.name, change.before)
                together = []
                for conflict in self._conflicts(pins):
                    other = conflict.name if conflict.requirer == change.name else conflict.requirer
                    if other in names and other not in together and other != change.name:
                        together.append(other)
                        pins = self.with_version(pins, other, names[other].before)
            except InstallError as exc:
                job.steps.append({"step": "swap", "package": change.name, "version": change.before, "note": str(exc)})
                continue
            if self.run(job, "swap", pins, change.name, change.before) == verdict_a:
                return change, pins, together
        return None, {}, []

    def search(self, job: Job, change: Change, pins_swap: dict, verdict_a: str, verdict_b: str, out: dict) -> None:
        """Binary search of ``change``'s releases between A's version and B's; fills ``out``."""
        start, end = change.before, change.after
        out["verdicts"] = {start: verdict_a, end: verdict_b}
        if start is None or end is None:
            out.update(status=FOUND, last_same=start, first_changed=end)
            out["note"] += f"{change.name} is installed in only one of the two stacks"
            return
        try:
            inner = between(self.releases(change.name), start, end, pre=self.pre, yanked=self.yanked)
        except OSError as exc:
            inner = []
            out["note"] += f"its releases could not be listed ({exc}); "

        def attempt(version: str) -> str | None:
            pins = self.with_version(pins_swap, change.name, version)
            found = [str(c) for c in self._conflicts(pins) if change.name in (c.name, c.requirer)]
            if found:
                raise InstallError(f"conflict: {found[0]}")
            verdict = self.run(job, "bisect", pins, change.name, version)
            out["verdicts"][version] = verdict
            return verdict

        lo, hi, skipped = split(inner, verdict_a, attempt)
        versions = [start, *(r.version for r in inner), end]
        out.update(status=FOUND, last_same=versions[lo + 1], first_changed=versions[hi + 1])
        out["skipped"] = [{"version": inner[i].version, "reason": reason} for i, reason in sorted(skipped.items())]
        if any(lo < i < hi for i in skipped):
            out["unsplit"] = [versions[lo + 1], versions[hi + 1]]
            out["note"] += (
                f"the range {versions[lo + 1]}..{versions[hi + 1]} could not be split: "
                + ", ".join(inner[i].version for i in sorted(skipped) if lo < i < hi)
                + " could not be installed here"
            )
        third = {v for v in out["verdicts"].values() if v not in (verdict_a, verdict_b)}
        if third:
            out["note"] += f"; some releases gave a third verdict ({', '.join(sorted(map(str, third)))})"

    def bisect_all(self, jobs: list[Job], workers: int = 1, log: Callable[[str], None] | None = None) -> list[dict]:
        """Every job's answer, in the jobs' order; ``workers`` rows at once."""

        def one(job: Job) -> dict:
            answer = self.bisect(job)
            if log:  # progress, as each row finishes (the answers themselves come at the end)
                log(
                    f"bisected {answer['model_id']} [{answer['variant']}]: {answer['status']}, {answer['seconds']:.0f} s"
                )
            return answer

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            return list(pool.map(one, jobs))


def answer_line(answer: dict) -> str:
    """One line per row: what changed it, or why it was not bisected."""
    name = answer["model_id"] + ("" if answer["variant"] == schema.DEFAULT_VARIANT else f" [{answer['variant']}]")
    runs = sum(1 for s in answer["steps"] if s.get("verdict") is not None or "seconds" in s)
    took = f"{runs} runs, {answer['seconds']:.1f} s"
    if answer["status"] == FOUND:
        said = (
            f"{name}: changed by {answer['package']} {answer['first_changed']} "
            f"(last with {answer['verdict_a']}: {answer['last_same']}; first with {answer['verdict_b']}: "
            f"{answer['first_changed']}); {took}"
        )
        if answer["skipped"]:
            said += "; skipped " + "; ".join(f"{s['version']} ({s['reason']})" for s in answer["skipped"])
        return said + (f"; {answer['note']}" if answer["note"] else "")
    return f"{name}: {answer['status']}: {answer['note']}; {took}"
