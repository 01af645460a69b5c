"""The porting plan proven by running (issue 48, parts 3, 5 and 7; docs/ops.md): ``model-support
ops SWEEP --prove`` runs each plan step's operators, cumulatively, on the host of the sweep's
device (what-if sweeps through the sweep runner) over the models the step unlocks, and says
whether they then PASS and agree with the CPU reference; ``--complete`` runs the stopped models
with every missing operator on the host, so their census lists all of them.

For real on the pretend device. A stack lacking ``aten::rsqrt`` and ``aten::gelu``, four models:
tiny-llama and tiny-qwen2 (RMSNorm: rsqrt), tiny-gpt-neox (GELU) and tiny-gemma (RMSNorm and
GELU: both). Each step is confirmed, and tiny-gemma is unlocked at the second and said so; the
stack's results, exports and support cards are what they were. A stack lacking ``aten::rsqrt``
and ``aten::bmm`` (the math attention's, which the CPU reference never calls: the CPU runs its
own fused attention), tiny-llama: its run stops at rsqrt, so its census (completed by the
reference's) lacks bmm and the census-only plan misses it; the proof's first step is not
confirmed, naming bmm; the proven plan names it; ``--complete`` lists it. The rules a reviewer
would try to bend (a PASS that diverges or was not checked, a run with other operators on the
host or of another stack, a proof.json edited by hand) on made-up runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STACK = {"missing_ops": ["aten::rsqrt", "aten::gelu"]}
BMM_STACK = {"missing_ops": ["aten::rsqrt", "aten::bmm"]}
MODELS = ("tiny-llama", "tiny-qwen2", "tiny-gpt-neox", "tiny-gemma")
PROBE = {"device": "pretend", "max_new_tokens": 2, "judge": False, "perf": False}
VARIANT = "eager+dynamic+2t"  # max_new_tokens 2


def cli(
    args: list, data: Path, stack: dict | None, check: bool = True
) -> subprocess.CompletedProcess:
    """The command line for real, with the pretend stack ``stack`` in its environment (None:
    unset)."""
    env = {**os.environ}
    env.pop("MODEL_SUPPORT_PRETEND", None)
    if stack is not None:
        env["MODEL_SUPPORT_PRETEND"] = json.dumps(stack)
    command = [sys.executable, "-m", "model_support.cli", *args, "--data-dir", str(data)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert not check or done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def sweep(tmp: Path, data: Path, name: str, models, stack: dict, workers: int) -> str:
    import yaml

    from model_support.record import store

    definition = tmp / f"{name}.yaml"
    listed = [str(REPO / "data" / "models" / m) for m in models]
    definition.write_text(
        yaml.safe_dump({"name": name, "probe": PROBE, "models": listed, "workers": workers})
    )
    cli(["sweep", str(definition), "--no-report"], data, stack)
    (found,) = store.list_sweeps(data)
    return found


def key(model: str) -> str:
    return f"local:{model} [{VARIANT}]"


def seen(data: Path, sweep_id: str) -> dict:
    """What the stack's readers say of its sweep: its results rows, its exports, each model's
    support card, and its records' bytes."""
    import polars as pl

    from model_support.analysis.support import support
    from model_support.record import store
    from model_support.render.exports import export

    rows = (
        store.scan(data, "results")
        .filter(pl.col("sweep_id") == sweep_id)
        .select("model_id", "status")
        .collect()
    )
    records = store.sweep_dir(data, sweep_id) / "records"
    return {
        "results": sorted(rows.rows()),
        "all_results": store.scan(data, "results").select(pl.len()).collect().item(),
        "junit": export(data, sweep_id, "junit"),
        "markdown": export(data, sweep_id, "markdown"),
        "support": {m: support(f"local:{m}", data) for m in MODELS},
        "records": {p.name: p.read_bytes() for p in sorted(records.glob("*.json"))},
    }


@pytest.fixture(scope="module")
def proven(tmp_path_factory, fixture_models) -> dict:
    """The four-model stack sweep, ``ops`` before, ``ops --prove``, ``ops`` after; what the
    stack's readers said before and after."""
    from model_support.record import store

    tmp = tmp_path_factory.mktemp("prove")
    data = tmp / "data"
    stack = sweep(tmp, data, "stack", MODELS, STACK, 2)
    before = seen(data, stack)
    census_only = json.loads(cli(["ops", stack, "--json"], data, STACK).stdout)
    done = cli(["ops", stack, "--prove", "--json"], data, STACK)
    what_if = sorted(set(store.list_sweeps(data)) - {stack})
    after_text = cli(["ops", stack], data, None).stdout  # the sweep's data alone
    return {
        "tmp": tmp,
        "data": data,
        "stack": stack,
        "before": before,
        "after": seen(data, stack),
        "census_only": census_only,
        "answer": json.loads(done.stdout),
        "said": done.stderr,
        "what_if": what_if,
        "text": after_text,
    }


@pytest.fixture(scope="module")
def bmm(tmp_path_factory, fixture_models) -> dict:
    """The stack lacking rsqrt and bmm, tiny-llama: ``ops`` (census only), ``ops --prove``, then
    ``ops --complete``."""
    tmp = tmp_path_factory.mktemp("prove-bmm")
    data = tmp / "data"
    stack = sweep(tmp, data, "bmm", ["tiny-llama"], BMM_STACK, 1)
    census_only = json.loads(cli(["ops", stack, "--json"], data, BMM_STACK).stdout)
    proved = cli(["ops", stack, "--prove"], data, BMM_STACK).stdout
    proved_json = json.loads(cli(["ops", stack, "--json"], data, None).stdout)
    completed = cli(["ops", stack, "--complete"], data, BMM_STACK).stdout
    return {
        "data": data,
        "stack": stack,
        "census_only": census_only,
        "proved": proved,
        "proved_json": proved_json,
        "completed": completed,
        "completed_json": json.loads(cli(["ops", stack, "--json"], data, None).stdout),
    }


def flat(text: str) -> str:
    return " ".join(text.split())


def test_each_step_is_confirmed_by_running_and_the_model_needing_both_is_unlocked_at_the_second(
    proven,
):
    plan = proven["answer"]["plan"]
    assert [(s["op"], sorted(s["unlocks"])) for s in plan] == [
        ("aten::rsqrt", [key("tiny-llama"), key("tiny-qwen2")]),
        ("aten::gelu", [key("tiny-gemma"), key("tiny-gpt-neox")]),
    ]
    assert [s["proof"]["outcome"] for s in plan] == ["confirmed", "confirmed"]
    assert [s["proof"]["said"] for s in plan] == [
        "confirmed: 2 of 2 predicted models PASS and agree with the reference"
    ] * 2
    assert plan[1]["with_earlier"] == {key("tiny-gemma"): [["aten::rsqrt", 1], ["aten::gelu", 2]]}
    said = flat(proven["said"])
    step1 = said[said.index("step 1: aten::rsqrt on the host (") : said.index("step 2:")]
    assert "tiny-llama" in step1 and "tiny-qwen2" in step1 and "tiny-gemma" not in step1
    assert step1.strip().endswith(
        "confirmed: 2 of 2 predicted models PASS and agree with the reference"
    )
    step2 = said[said.index("step 2:") :]
    assert step2.startswith(
        "step 2: aten::gelu on the host, with step 1's aten::rsqrt (what-if sweep "
    )
    assert (
        "confirmed: 2 of 2 predicted models PASS and agree with the reference; tiny-gemma "
        f"[{VARIANT}] needs aten::rsqrt (step 1) and aten::gelu (step 2): unlocked at step 2, "
        "with both" in step2
    )
    standing = proven["answer"]["standing"]
    assert standing[key("tiny-llama")].startswith("runs with 1 operator on the host (aten::rsqrt; ")
    assert standing[key("tiny-gemma")].startswith(
        "runs with 2 operators on the host (aten::rsqrt, aten::gelu; "
    )
    assert "confirmed: 2 of 2" in flat(proven["text"])  # read back from the records, no stack set


def test_the_steps_ran_as_what_if_sweeps_of_only_the_models_each_unlocks(proven):
    from model_support.ops import proof
    from model_support.record import store

    data, stack = proven["data"], proven["stack"]
    record = proof.read(data, stack)
    # named in the stack's folder, in order
    assert [r["sweep_id"] for r in record["runs"]] == proven["what_if"]
    asked = {s: store.read_sweep(data, s) for s in proven["what_if"]}
    assert sorted(
        (m.probe["host_ops"], sorted(e.model_id for e in m.models)) for m in asked.values()
    ) == [
        ("aten::gelu,aten::rsqrt", ["local:tiny-gemma", "local:tiny-gpt-neox"]),
        ("aten::rsqrt", ["local:tiny-llama", "local:tiny-qwen2"]),
    ]  # at most one probe per model per step: 4 in all
    assert all(m.name == "stack-what-if" and stack in m.description for m in asked.values())


def test_a_what_if_pass_is_never_the_stacks(proven):
    """The results config, the exports, every support card and the stack's records read the same
    after the proof; ops still predicts the stack's own verdicts (nothing passes on it), and the
    gate refuses a what-if sweep."""
    assert proven["after"] == proven["before"]
    answer = proven["answer"]
    assert answer["passing"] == 0 and all(
        m["predicted"] == "FAIL(gen)" for m in answer["models"].values()
    )
    assert (
        [s["passing"] for s in answer["plan"]]
        == [s["passing"] for s in proven["census_only"]["plan"]]
        == [2, 4]
    )
    done = cli(
        ["diff", proven["stack"], proven["what_if"][0], "--fail-on", "regressions"],
        proven["data"],
        None,
        False,
    )
    assert done.returncode != 0 and "is a what-if sweep" in done.stdout + done.stderr


def test_the_report_and_the_nightlys_draft_say_what_running_confirmed(proven):
    from model_support import nightly

    data, stack = proven["data"], proven["stack"]
    cli(["report", stack, "--baseline", ""], data, None)
    page = (data / "reports" / f"{stack}.html").read_text()
    section = page[page.index('id="what-if"') :]
    section = flat(re.sub(r"<[^>]+>", " ", section[: section.index("<h2", 10)]))
    assert "2 of 2 steps confirmed by running" in section
    assert "runs with 2 operators on the host (aten::rsqrt, aten::gelu;" in section
    changes = [
        {
            "model_id": "local:tiny-gemma",
            "variant": VARIANT,
            "before": "PASS",
            "after": "FAIL(gen)",
            "signature": "s",
        }
    ]
    (path,) = nightly._draft(data, "stack", stack, stack, changes, False, None, lambda _: None)
    draft = flat(path.read_text())
    assert (
        "Confirmed by running: 2 of 2 predicted models PASS and agree with the reference" in draft
    )


def test_proving_on_another_stack_is_refused_and_an_edited_proof_confirms_nothing(proven, tmp_path):
    data, stack = proven["data"], proven["stack"]
    done = cli(["ops", stack, "--prove"], data, {"missing_ops": ["aten::rsqrt"]}, check=False)
    assert (
        done.returncode == 2
        and "which is not the one sweep" in done.stderr
        and "MODEL_SUPPORT_PRETEND" in done.stderr
    )
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    path = copy / "sweeps" / stack / "proof.json"
    edited = json.loads(path.read_text())
    for step in edited["steps"]:
        step["outcome"], step["said"] = "confirmed", "confirmed: edited"
    # step 2's what-if sweep is no longer named: its runs are no evidence
    edited["runs"] = edited["runs"][:1]
    path.write_text(json.dumps(edited))
    plan = json.loads(cli(["ops", stack, "--json"], copy, None).stdout)["plan"]
    assert [s["proof"]["outcome"] for s in plan] == ["confirmed", "predicted"]
    assert all(
        "edited" not in s["said"]
        for s in json.loads(cli(["ops", stack, "--json"], copy, None).stdout)["proof"]
    )


def test_the_census_only_plan_misses_the_math_attentions_bmm_and_the_proof_names_it(bmm):
    llama = key("tiny-llama")
    census_only = bmm["census_only"]
    # its run stopped at rsqrt: bmm unseen
    assert [s["op"] for s in census_only["plan"]] == ["aten::rsqrt"]
    assert "aten::bmm" not in json.dumps(census_only)
    said = flat(bmm["proved"])
    assert (
        "step 1: aten::rsqrt on the host (what-if sweep" in said
        and f"not confirmed: tiny-llama [{VARIANT}] then fails at aten::bmm, which the census did "
        "not see (0 of 1 predicted model PASSes and agrees with the reference)"
        in said
    )
    assert "step 2: aten::bmm on the host, with step 1's aten::rsqrt" in said
    assert "confirmed: 1 of 1 predicted model PASSes and agrees with the reference" in said
    # the proven plan: bmm found by running, one step with both, confirmed
    proved = bmm["proved_json"]
    assert [(s["ops"], s["proof"]["outcome"]) for s in proved["plan"]] == [
        (["aten::bmm", "aten::rsqrt"], "confirmed")
    ]
    assert proved["models"][llama]["learned"] == {"aten::bmm": "missing"}
    # the proof as it ran
    assert [s["outcome"] for s in proved["proof"]] == ["not confirmed", "confirmed"]
    completed = bmm["completed_json"]["models"][llama]  # host_ops: missing lists it too
    assert completed["ops_missing"] == ["aten::rsqrt", "aten::bmm"] and completed["completed_by"]
    assert "the stack lacks aten::rsqrt, aten::bmm" in flat(bmm["completed"])


def run(
    setting="aten::rsqrt",
    status="PASS",
    numerics="match",
    failed_at=None,
    sweep="w",
    registered=None,
):
    from model_support.ops.proof import Run

    forms = (
        registered
        if registered is not None
        else [f"{op}.out" for op in setting.split(",")] + setting.split(",")
    )
    return Run(sweep, setting, tuple(forms), status, numerics, failed_at, False, "E: m", (), 1.0)


@pytest.mark.parametrize(
    ("found", "outcome", "said"),
    [
        (run(), "confirmed", "confirmed: 1 of 1 predicted model PASSes"),
        (run(numerics="diverges"), "not confirmed", "its output diverges from the CPU reference"),
        (
            run(numerics=None),
            "not confirmed",
            "its numbers were not checked against the CPU reference (numerics: none)",
        ),
        # more on the host
        (run(setting="aten::gelu,aten::rsqrt"), "predicted", "not run with these operators"),
        (run(registered=[]), "not confirmed", "did not put aten::rsqrt on the host"),
        (
            run(status="FAIL(gen)", numerics=None, failed_at="aten::bmm"),
            "not confirmed",
            "then fails at aten::bmm",
        ),
        (
            run(status="FAIL(gen)", numerics=None, failed_at="aten::rsqrt"),
            "not confirmed",
            "still fails at aten::rsqrt",
        ),
        (run(status="FAIL(gen)", numerics=None), "not confirmed", "FAIL(gen), naming no operator"),
    ],
)
def test_a_step_is_confirmed_only_by_a_pass_that_agrees_with_exactly_its_operators_on_the_host(
    found, outcome, said
):
    from model_support.ops.proof import judge

    judged = judge(["aten::rsqrt"], ["m"], {"m": [found]})
    assert judged.outcome == outcome and said in judged.said, judged.said


def test_a_what_if_sweep_of_another_stack_is_no_evidence(proven, tmp_path):
    from model_support.ops import proof
    from model_support.record import store

    copy = tmp_path / "data"
    shutil.copytree(proven["data"], copy)
    for sweep_id in proven["what_if"]:
        meta = store.read_sweep(copy, sweep_id)
        meta.device_config = {"MODEL_SUPPORT_PRETEND": json.dumps({"missing_ops": []})}
        meta.write(store.sweep_dir(copy, sweep_id))
    assert proof.runs(copy, proven["stack"]) == {} and proof.runs(proven["data"], proven["stack"])


def test_a_step_whose_model_passed_once_and_failed_once_with_its_operators_is_not_confirmed():
    """Every run of a model with the step's operators must be right: a flaky one confirms
    nothing."""
    from model_support.ops.proof import judge

    flaky = [run(), run(status="FAIL(gen)", numerics=None, sweep="w2")]
    judged = judge(["aten::rsqrt"], ["m"], {"m": flaky})
    assert judged.outcome == "not confirmed" and "FAIL(gen), naming no operator" in judged.said


def test_an_interrupted_what_if_sweep_is_resumed_not_run_again(proven, tmp_path):
    """A step's what-if sweep that lost a model's record (a stop mid-sweep) is finished by the
    next --prove: the same sweep, that one model probed again, the step confirmed; every other
    step read back, not run again."""
    from model_support.record import store

    copy = tmp_path / "data"
    shutil.copytree(proven["data"], copy)
    first = proven["what_if"][0]
    (record,) = [p for p in (store.sweep_dir(copy, first) / "records").glob("*tiny-llama*")]
    record.unlink()
    shutil.rmtree(copy / "what_if" / f"sweep={first}")
    done = cli(["ops", proven["stack"], "--prove", "--json"], copy, STACK)
    # no new sweep
    assert sorted(set(store.list_sweeps(copy)) - {proven["stack"]}) == proven["what_if"]
    assert (
        record.exists()
        and [s["proof"]["outcome"] for s in json.loads(done.stdout)["plan"]] == ["confirmed"] * 2
    )


def test_an_operator_that_cannot_run_on_the_host_makes_its_step_not_proven_and_runs_nothing(
    tmp_path, fixture_models
):
    """A stack lacking a view (aten::transpose): the plan's step cannot be put on the host, so no
    model is run."""
    from model_support.record import store

    data = tmp_path / "data"
    views = {"missing_ops": ["aten::transpose"]}
    stack = sweep(tmp_path, data, "views", ["tiny-llama"], views, 1)
    done = cli(["ops", stack, "--prove", "--json"], data, views)
    said = flat(done.stderr)
    assert (
        "step 1: aten::transpose" in said
        and "(nothing run): not proven:" in said
        and "it is a view" in said
    )
    assert f"tiny-llama [{VARIANT}] not run: it needs aten::transpose" in said
    (step,) = json.loads(done.stdout)["plan"]
    assert step["proof"]["outcome"] == "not confirmed" and step["proof"]["said"].startswith(
        "not proven: aten::transpose"
    )
    assert store.list_sweeps(data) == [stack]  # no what-if sweep


def test_a_proof_whose_plan_changed_since_it_ran_is_said_to_be_stale(proven):
    """The last --prove's steps against the plan now: alike, none is stale; a plan whose step 2
    unlocks another model, or that has one step only, makes the old step stale, said with how the
    plan reads now."""
    from model_support import ops as ops_mod
    from model_support.ops.plan import PlanStep
    from model_support.ops.prove import last_proof

    data, stack = proven["data"], proven["stack"]
    models = ops_mod.sweep_models(data, stack)
    ops_mod.predict(models, None)
    steps = ops_mod.porting_plan(models)
    assert [s["stale"] for s in last_proof(data, stack, models, steps)] == [None] * len(steps)
    changed = [steps[0], PlanStep(steps[1].ops, ["local:tiny-opt"], [], 0, {})]
    said = last_proof(data, stack, models, changed)[1]["said"]
    assert (
        f"stale: the plan's step 2 is now {' + '.join(steps[1].ops)}, unlocking tiny-opt (run "
        "--prove again)" in said
    )
    assert (
        last_proof(data, stack, models, steps[:1])[1]["stale"]
        == "the plan has 1 step now, no step 2"
    )
