"""``make mutation``: mutation testing (cosmic-ray) over the modules whose rules decide answers, with its report.

A test suite that passes says nothing about a rule no test would notice breaking. Here each rule is broken on
purpose, one small change at a time (a mutant: ``<`` for ``<=``, ``4.0`` for ``3.0``, a condition negated, a loop
that never runs), in a scratch copy of the sources (``--scratch``; the work tree is never touched), and the module's
fast test files run against it: a test that fails kills the mutant, a mutant every test survives is a rule no test
guards, or a change that changes nothing (an equivalent mutant). Each survivor is either killed by a new test or
written down in ``EQUIVALENT`` below, with why; the report (bench/mutation.md, between its markers) says for each
module the mutants generated, left out by the filter (and why), tried, killed and surviving, and lists every
survivor with its reason, or "no reason" (kill it, or write one).

Slow (each mutant runs its module's tests in a fresh pytest, 2 to 30 s each on a busy 2-core machine: about two and a
half hours for the seven modules, bench/mutation.md), so never part of ``make test`` or CI. ``--only decision`` runs
one module; ``--resume`` carries on with the sessions left in the scratch folder (cosmic-ray keeps each mutant's result
in a SQLite session); ``--recheck`` tries that module's survivors again, against the tests as they are now (after a
new test); ``--report-only`` rewrites the report from the sessions there.

Left out by the filter, never tried: mutants outside the rules named for a module (``names``: the store's journal,
not its whole file); mutants inside an annotation (every module here has ``from __future__ import annotations``:
annotations are never evaluated, so ``str | None`` -> ``str & None`` changes nothing); arithmetic swapped for bitwise,
shift, power, floor-division or modulo operators and back (cosmic-ray tries every binary operator for every other:
on floats and strings these raise at once, never telling anything a ``+`` -> ``-`` does not), and the variable
inserter/replacer (random names, not reproducible).
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REPORT = HERE / "mutation.md"
BEGIN, END = "<!-- mutation:begin -->", "<!-- mutation:end -->"
PACKAGE = "src/model_support"


@dataclass(frozen=True)
class Target:
    """One module: its path under the package, the fast tests that guard it (pytest arguments,
    run in this order, stopping at the first failure), and the rules mutated (top-level
    functions, classes or assignments by name; empty: the whole module)."""

    name: str
    module: str
    tests: tuple[str, ...]
    names: tuple[str, ...] = ()


#: The unit tests of the device phase's clock and the perf phase's rules (the files' other tests run
#: real probes).
PHASES_TESTS = (
    "stages_hook or outside_a_device or counts_from_zero or fresh_process or raises or "
    "part_counts or budget_is or repeats_stop"
)
PERF_TESTS = (
    "plan_stops or time_limit or no_budget or budget_is or verdicts_steps or suppresses or "
    "part_counts or repeats_stop or tpot_samples or spread_is_relative or cap_and_deadline or "
    "measured_over or noise or slowdown"
)

TARGETS = (
    Target(
        "decision",
        "analysis/decision.py",
        ("tests/test_decision.py", "tests/test_likeness.py"),
        # the rules: the states, the decision, the likeness, the noise; not the readers of the store
        # (read_runs, sweep_settings, earlier_verdicts, relabel), which the gate's and the diff's
        # slow tests cover
        (
            "STATES",
            "VERDICT_STATES",
            "KINDS",
            "GATES",
            "FAILS_UNDER",
            "SAID",
            "Run",
            "Change",
            "verdict_state",
            "flaky_attempts",
            "live",
            "_name",
            "decide",
            "decide_sweeps",
            "ALIKE",
            "ACROSS",
            "check_across",
            "unlike_sweeps",
            "refuse_unlike",
            "NOISE_SIGMAS",
            "MEDIAN_SE",
            "LIKE",
            "_QUOTED",
            "_QUOTED_CHARS",
            "finite",
            "median_noise",
            "_TRIMMED_SIGMA",
            "_trimmed_bias",
            "MetricChange",
            "compare_repeats",
            "unlike",
            "SweepRuns",
        ),
    ),
    Target(
        "gate",
        "analysis/gate.py",
        ("tests/test_gate.py", "tests/test_gate_alike.py", "tests/test_likeness.py"),
        ("GATES", "ACROSS", "GateResult", "check_gates", "gate", "_judged", "_slower"),
    ),
    Target(
        "perf (likeness)",
        "analysis/perf.py",
        (
            "tests/test_likeness.py",
            "tests/test_perf_noise.py",
            "tests/test_gate_alike.py",
            "tests/test_gate.py",
        ),
        (
            "METRICS",
            "COLUMNS",
            "clock_col",
            "direction",
            "derived_tokens_per_s",
            "judged",
            "compare_runs",
        ),
    ),
    Target(
        "phases",
        "probe/phases.py",
        ("tests/test_phases.py", "tests/test_perf_phase.py", "-k", PHASES_TESTS),
        (
            "HOST_STAGES",
            "_Clock",
            "start",
            "_close",
            "_open",
            "device_work",
            "stages",
            "part",
            "to_device",
            "device_phase",
        ),
    ),
    Target(
        "performance (noise)",
        "probe/performance.py",
        ("tests/test_perf_phase.py", "tests/test_perf_noise.py", "-k", PERF_TESTS),
        (
            "spread",
            "Plan",
            "MIN_OWN",
            "MIN_SAMPLES",
            "tokens_per_s",
            "tpot_samples",
            "verdict_steps",
            "budget",
            "_deadline",
        ),
    ),
    Target(
        "redact",
        "redact.py",
        ("tests/test_redact.py", "tests/test_signatures.py", "-k", "redact or token"),
    ),
    Target(
        "store (journal)",
        "record/journal.py",
        ("tests/test_journal.py",),
        (
            "CHANGE",
            "SIDECARS",
            "change",
            "_apply_sidecars",
            "_take_over",
            "interrupted",
            "finish_interrupted",
        ),
    ),
)

#: Operators never tried (see the module's docstring): cosmic-ray's names, as regular expressions.
LEFT_OUT_OPERATORS = (
    r"core/ReplaceBinaryOperator_(Add|Sub|Mul|Div)_(FloorDiv|Mod|Pow|RShift|LShift|BitOr|BitAnd|BitXor)",
    r"core/ReplaceBinaryOperator_(FloorDiv|Mod|Pow|RShift|LShift|BitOr|BitAnd|BitXor)_"
    r"(Add|Sub|Mul|Div|FloorDiv|Mod|Pow|RShift|LShift)",
    r"core/Variable(Replacer|Inserter)",
)

#: Parts of the lines and reasons ``EQUIVALENT`` says more than once.
_SIGMA = "sigma = statistics.stdev(kept) / _trimmed_bias(len(values)) if len(kept) >= 2 else "
_SORT = "for old, new in sorted((replace or {}).items(), key=lambda kv: "
_REGEX = (
    "the phrase has no regular-expression metacharacter: read as a pattern it matches what it "
    "matches read literally"
)
_LONG_TEXT = (
    "not equivalent, guarded elsewhere: the long-text gate's lines (new work, uncommitted "
    "when this ran) are killed by "
    "tests/test_long_text.py::test_a_long_text_drop_beyond_the_tolerance_is_a_regression_the_gate_and_the_nightly_name "
    "(checked by hand; a slower test outside this module's list)"
)
#: Survivors that change nothing, with why: (target name, the original line, the mutant's line; both
#: stripped) -> reason. A survivor not here is listed as "no reason" in the report: kill it with a
#: test, or write why it cannot be.
EQUIVALENT: dict[tuple[str, str, str], str] = {
    (
        "decision",
        "if n > 60:",
        "if n > 59:",
    ): "60 is a row of the table, returned before this line is reached: "
    "`> 59` and `> 60` differ at 60 only",
    (
        "decision",
        "if n > 60:",
        "if n >= 60:",
    ): "the same: `>= 60` and `> 60` differ at 60 only, a row returned above",
    (
        "decision",
        _SIGMA + "0.0",
        _SIGMA.replace(">= 2", ">= 1") + "0.0",
    ): "`kept` always holds two repeats or more here (fewer than two returned None above; two "
    "are kept whole, three or more lose one): the else branch is dead",
    (
        "decision",
        _SIGMA + "0.0",
        _SIGMA + "-1.0",
    ): "the same dead else branch (`kept` holds two repeats or more)",
    ("decision", _SIGMA + "0.0", _SIGMA + "1.0"): "the same dead else branch",
    (
        "decision",
        "low = max(k for k in _TRIMMED_SIGMA if k < n)",
        "low = max(k for k in _TRIMMED_SIGMA if k <= n)",
    ): "n is no row of the table here (a row returned above): `k <= n` and `k < n` pick the same "
    "row",
    (
        "decision",
        "if len(allowed) == len(differs)",
        "if len(allowed) >= len(differs)",
    ): "`allowed` is a subset of `differs`: its length reaches theirs only when they are equal",
    (
        "decision",
        "if len(allowed) == len(differs)",
        "if len(allowed) is len(differs)",
    ): "lengths of at most three "
    "(ALIKE's words): CPython keeps one object per small int, so `is` agrees with `==`",
    (
        "decision",
        "if b.state == ABSENT:",
        "if b.state <= ABSENT:",
    ): "B's state here is `absent` or `no row` (every "
    "other returned above), and of those only `absent` sorts at or before `absent`",
    (
        "decision",
        "high = min(k for k in _TRIMMED_SIGMA if k > n)",
        "high = min(k for k in _TRIMMED_SIGMA if k >= n)",
    ): "n is no row of the table here (a row returned above): `k >= n` and `k > n` pick the same "
    "row",
    (
        "decision",
        "return MetricChange(metric, SLOWER if worse > 0 else FASTER, a, b, change, bound)",
        "return MetricChange(metric, SLOWER if worse >= 0 else FASTER, a, b, change, bound)",
    ): "reached only when |change| > bound >= 0, so `worse` (+-change) is never 0",
    (
        "perf (likeness)",
        '*(f for f in decision.LIKE if f != "perf_clock"),',
        '*(f for f in decision.LIKE if f is not "perf_clock"),',
    ): "both are string literals of this package, interned by CPython: `is not` agrees with `!=` "
    "for LIKE's own keys, the only values compared",
    (
        "perf (likeness)",
        'pl.when(note.str.contains("device\'s own clock", literal=True))',
        'pl.when(note.str.contains("device\'s own clock", literal=False))',
    ): _REGEX,
    (
        "perf (likeness)",
        '.when(note.str.contains("host\'s wall clock", literal=True))',
        '.when(note.str.contains("host\'s wall clock", literal=False))',
    ): _REGEX,
    (
        "performance (noise)",
        'if verdict is None or settings["mode"] == "compile" or own_clock is None:',
        'if verdict is None or settings["mode"] <= "compile" or own_clock is None:',
    ): "the modes are eager, fused and compile (`probe_params` refuses any other): only compile "
    "sorts at or before compile",
    (
        "performance (noise)",
        "if self.goal > 0 and (settled or not adds_steps):",
        "if self.goal != 0 and (settled or not adds_steps):",
    ): "the goal is `perf_spread`, at least 0 (`probe_params` refuses less): `!= 0` and `> 0` "
    "agree",
    (
        "performance (noise)",
        "return list(decoded[0]) if decoded else []",
        "return list(decoded[ -1]) if decoded else []",
    ): "reached with one generation only (two or more returned above): its first is its last",
    (
        "performance (noise)",
        'share = float(settings.get("perf_budget") or 0.0)',
        'share = float(settings.get("perf_budget") or -1.0)',
    ): "a budget not given read as -1 is at most 0 as 0 is: no limit either way",
    (
        "performance (noise)",
        "if share <= 0:",
        "if share == 0:",
    ): "`perf_budget` is at least 0 (`probe_params` refuses less): `== 0` and `<= 0` agree",
    (
        "phases",
        "staged = False",
        "staged = True",
    ): "every `device_work` sets it before its only reader (the `stages` hook, which reads it "
    "only inside a block) can look at it: the class's initial value is never read",
    (
        "gate",
        "elif change.kind == decision.EXPECTED:",
        "elif change.kind is decision.EXPECTED:",
    ): "a change's kind "
    "is always one of `decision`'s own constants (`decide` sets it), so `is` and `==` agree",
    ("gate", 'if "regressions" in fail_on:', 'if not "regressions" in fail_on:'): _LONG_TEXT,
    ("gate", "if dropped:", "if not dropped:"): _LONG_TEXT,
    (
        "redact",
        "@overload",
        "",
    ): "`typing.overload` declarations, for the type checker: the plain `def` after them "
    "replaces them at run time",
    (
        "redact",
        _SORT + "-len(kv[0])):",
        _SORT + "~len(kv[0])):",
    ): "~n is -n - 1: the same order, longest first",
}


def spans(
    source: str, names: tuple[str, ...]
) -> tuple[list[tuple[int, int]], list[tuple[tuple, tuple]]]:
    """(the line ranges of ``names``' top-level definitions, every annotation's (start, end)
    position)."""
    tree = ast.parse(source)
    wanted = []
    for node in tree.body:
        found: set[str] = set()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found = {node.name}
        elif isinstance(node, ast.Assign):
            found = {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = {node.target.id}
        if found & set(names):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            wanted.append((first, node.end_lineno or node.lineno))
    notes = []
    for node in ast.walk(tree):
        parts = []
        if isinstance(node, ast.arg) and node.annotation is not None:
            parts.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            parts.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        for part in parts:
            notes.append(((part.lineno, part.col_offset), (part.end_lineno, part.end_col_offset)))
    return wanted, notes


def defined(source: str) -> set[str]:
    """The top-level names a module defines (to check a target's ``names`` against)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def left_out(target: Target, found: tuple, operator: str, start: tuple, end: tuple) -> str | None:
    """Why a mutant is not tried (the filter), or None; ``found``: the module's ``spans``."""
    lines, notes = found
    if target.names and not any(first <= start[0] <= last for first, last in lines):
        return "outside the module's rules"
    if any(a <= tuple(start) and tuple(end) <= b for a, b in notes):
        return "inside an annotation (never evaluated)"
    if any(re.fullmatch(pattern, operator) for pattern in LEFT_OUT_OPERATORS):
        return "operator left out"
    return None


def cosmic_ray() -> str:
    found = Path(sys.executable).with_name("cosmic-ray")
    if found.exists():
        return str(found)
    which = shutil.which("cosmic-ray")
    if which is None:
        sys.exit(
            "cosmic-ray is not installed: `make mutation` installs it (the `mutation` extra, "
            "pinned in constraints.txt)"
        )
    return which


def scratch_copy(scratch: Path, resume: bool) -> None:
    """The sources and tests copied into ``scratch`` (mutants are written there, never in the
    work tree), and the sources kept unmutated beside them (``pristine``); resuming, the sources
    are put back from that copy (a run stopped mid-mutant can leave one written) and the tests
    taken anew from the work tree."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ruff_cache", ".mypy_cache")
    pristine = scratch / "pristine"
    if not (resume and pristine.exists()):
        if pristine.exists():
            shutil.rmtree(pristine)
        shutil.copytree(REPO / "src", pristine, ignore=ignore)
    for part, source in (("src", pristine), ("tests", REPO / "tests")):
        if (scratch / part).exists():
            shutil.rmtree(scratch / part)
        shutil.copytree(source, scratch / part, ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", scratch / "pyproject.toml")


def test_command(target: Target, timeout_s: int) -> list[str]:
    return [
        sys.executable,
        *("-m", "pytest", "-x", "-q", "--no-header", "-p", "no:cacheprovider", "-o", "addopts="),
        *("--timeout", str(timeout_s), "-W", "ignore"),
        *target.tests,
    ]


def slug(target: Target) -> str:
    return re.sub(r"\W+", "_", target.name).strip("_")


def run_target(
    target: Target, scratch: Path, resume: bool, env: dict, recheck: bool = False
) -> dict:
    """Init (unless resuming), filter, check the tests pass unmutated, run every mutant; returns
    the figures."""
    module = f"{PACKAGE}/{target.module}"
    source = (scratch / module).read_text()
    unknown = set(target.names) - defined(source)
    if unknown:
        sys.exit(
            f"{target.module} defines no {', '.join(sorted(unknown))}: update TARGETS in "
            "bench/mutation.py"
        )
    session = scratch / f"{slug(target)}.sqlite"
    began = time.monotonic()
    baseline = subprocess.run(
        test_command(target, 600), cwd=scratch, env=env, capture_output=True, text=True
    )
    base_s = time.monotonic() - began
    if baseline.returncode != 0:
        sys.exit(f"{target.name}: its tests fail on the unmutated code:\n{baseline.stdout[-3000:]}")
    timeout_s = int(max(60, 10 * base_s))
    config = scratch / f"{slug(target)}.toml"
    command = shlex.join(test_command(target, timeout_s))  # cosmic-ray splits it with shlex
    config.write_text(
        "[cosmic-ray]\n"
        f"module-path = {json.dumps(module)}\n"
        f"timeout = {float(timeout_s)}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(command)}\n"
        '[cosmic-ray.distributor]\nname = "local"\n'
    )
    if not (resume and session.exists()):
        session.unlink(missing_ok=True)
        subprocess.run(
            [cosmic_ray(), "init", str(config), str(session)], cwd=scratch, check=True, env=env
        )
        skip(target, session, source)
    elif recheck:  # the survivors tried again (against the tests as they are now), the rest kept
        with sqlite3.connect(session) as db:
            db.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'")
    print(f"{target.name}: tests pass unmutated in {base_s:.1f} s; running its mutants", flush=True)
    subprocess.run(
        [cosmic_ray(), "exec", str(config), str(session)], cwd=scratch, check=True, env=env
    )
    return {
        "target": target.name,
        "seconds": time.monotonic() - began,
        "baseline_s": base_s,
        "session": str(session),
    }


def skip(target: Target, session: Path, source: str) -> None:
    """Mark the mutants the filter leaves out as skipped in cosmic-ray's session (what its own
    filters do)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    found = spans(source, target.names)
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.work_items:
            (spec,) = item.mutations
            why = left_out(target, found, spec.operator_name, spec.start_pos, spec.end_pos)
            if why is not None:
                db.set_result(
                    item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=why)
                )


def figures(target: Target, session: Path, source: str) -> dict:
    """The counts and the survivors of one session, read from its SQLite file."""
    db = sqlite3.connect(session)
    rows = db.execute(
        "SELECT s.operator_name, s.start_pos_row, s.start_pos_col, r.worker_outcome, "
        "r.test_outcome, r.output, r.diff FROM mutation_specs s LEFT JOIN work_results r ON "
        "r.job_id = s.job_id"
    ).fetchall()
    lines = source.splitlines()
    found = {
        "generated": len(rows),
        "left_out": {},
        "tried": 0,
        "killed": 0,
        "survived": [],
        "pending": 0,
    }
    for operator, row, _col, worker, test, output, diff in rows:
        if worker is None:
            found["pending"] += 1
        elif worker.lower() == "skipped":
            found["left_out"][output] = found["left_out"].get(output, 0) + 1
        else:
            found["tried"] += 1
            if "no tests ran" in (output or "") or (worker or "").lower() != "normal":
                # its tests did not run: neither killed nor survived
                found["broken"] = found.get("broken", 0) + 1
            elif (test or "").lower() == "survived":
                line = lines[row - 1].strip()
                changed = [
                    d[1:].strip()
                    for d in (diff or "").splitlines()
                    if d.startswith("+") and not d.startswith("+++")
                ]
                reason = EQUIVALENT.get((target.name, line, changed[0] if changed else ""))
                found["survived"].append(
                    {
                        "line": row,
                        "operator": operator.removeprefix("core/"),
                        "code": line,
                        "mutant": changed[:1],
                        "reason": reason,
                    }
                )
            else:
                found["killed"] += 1
    found["survived"].sort(key=lambda said: said["line"])
    return found


def write_report(results: list[dict]) -> None:
    """bench/mutation.md between its markers: the table and the survivors; what is outside them
    is kept."""
    out = [
        BEGIN,
        f"Generated by `make mutation` (bench/mutation.py, cosmic-ray) on {_dt.date.today()}; "
        "the work tree untouched.",
        "",
        "| module | rules mutated | generated | left out | tried | killed | survived | with a "
        "reason | not run | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f = r["figures"]
        explained = sum(1 for s in f["survived"] if s["reason"])
        rules = "the whole module" if not r["names"] else f"{len(r['names'])} named"
        out.append(
            f"| `{r['module']}` | {rules} | {f['generated']} | {sum(f['left_out'].values())} | "
            f"{f['tried']} | {f['killed']} | {len(f['survived'])} | {explained} | "
            f"{f.get('broken', 0) + f['pending']} | {r['seconds'] / 60:.1f} |"
        )
    out += [
        "",
        "Not run: a mutant whose tests could not run (cosmic-ray could not apply it) or still "
        "pending; a timeout counts as killed.",
        "",
        "Left out by the filter (never tried):",
        "",
    ]
    for r in results:
        said = "; ".join(f"{why}: {n}" for why, n in sorted(r["figures"]["left_out"].items()))
        out.append(f"- `{r['module']}`: {said or 'none'}")
    out += ["", "Survivors (each equivalent, with why, or to be killed):", ""]
    for r in results:
        for s in r["figures"]["survived"]:
            mutant = f" -> `{s['mutant'][0]}`" if s["mutant"] else ""
            out.append(
                f"- `{r['module']}:{s['line']}` {s['operator']}: `{s['code']}`{mutant}: "
                + (
                    s["reason"]
                    or "**no reason: kill it with a test or write why it is equivalent**"
                )
            )
    out.append(END)
    text = (
        REPORT.read_text()
        if REPORT.exists()
        else "# Mutation testing\n\n" + BEGIN + "\n" + END + "\n"
    )
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    REPORT.write_text(head + "\n".join(out) + tail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scratch",
        default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "model-support-mutation"),
    )
    parser.add_argument(
        "--only", action="append", help="a target's name (its first word: decision, gate, ...)"
    )
    parser.add_argument(
        "--resume", action="store_true", help="carry on with the sessions left in --scratch"
    )
    parser.add_argument(
        "--recheck",
        action="store_true",
        help="try the survivors again (after a new test), keep the rest",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from the sessions left"
    )
    args = parser.parse_args()
    scratch = Path(args.scratch).resolve()
    if REPO in (scratch, *scratch.parents):
        sys.exit("--scratch must be outside the work tree: mutants are written there")
    scratch.mkdir(parents=True, exist_ok=True)
    chosen = [t for t in TARGETS if not args.only or t.name.split()[0] in args.only]
    if not args.report_only:
        scratch_copy(scratch, args.resume or args.recheck)
    # no kernel zygote: these tests start no kernel, and a zygote per mutant's pytest is seconds of
    # CPU each
    env = {**os.environ, "PYTHONPATH": str(scratch / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    env["MODEL_SUPPORT_KERNEL_ZYGOTE"] = "off"
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    timings = {}
    for target in chosen:
        if not args.report_only:
            ran = run_target(target, scratch, args.resume or args.recheck, env, args.recheck)[
                "seconds"
            ]
            # a resumed run adds to the time the first one took
            stamp = scratch / f"{slug(target)}.seconds"
            timings[target.name] = ran + (
                float(stamp.read_text())
                if stamp.exists() and (args.resume or args.recheck)
                else 0.0
            )
    results = []
    # every target whose session is here: one run of --only keeps the others' figures
    for target in TARGETS:
        session = scratch / f"{slug(target)}.sqlite"
        if not session.exists():
            continue
        source = (scratch / PACKAGE / target.module).read_text()
        seconds = timings.get(target.name)
        if seconds is None:
            stamp = scratch / f"{slug(target)}.seconds"
            seconds = float(stamp.read_text()) if stamp.exists() else 0.0
        else:
            (scratch / f"{slug(target)}.seconds").write_text(str(seconds))
        results.append(
            {
                "module": target.module,
                "names": target.names,
                "seconds": seconds,
                "figures": figures(target, session, source),
            }
        )
    write_report(results)
    for r in results:
        f = r["figures"]
        print(
            f"{r['module']}: tried {f['tried']}, killed {f['killed']}, survived "
            f"{len(f['survived'])}"
        )


if __name__ == "__main__":
    main()
