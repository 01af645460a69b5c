"""Wrong operators in the porting plan (issue 48, part 4; docs/ops.md): an operator
``model-support localise`` found wrong is a step of the plan like a missing one, from the sweep's
own data (the answers localise keeps in the sweep's folder), never from the adapter's knowledge
of its faults.

For real: a sweep on the pretend device with ``wrong_ops: ["aten::rsqrt"]`` over tiny-llama and
tiny-qwen2 (RMSNorm: rsqrt) and tiny-gpt2 (no rsqrt) gives two diverging PASSes. Before localise,
``ops SWEEP`` names no step and says the two are not localised, with the commands; after a real
localise of each, ``ops SWEEP`` (the CLI) and the report's plan section (the report rendered, its
HTML read) list ``aten::rsqrt`` as a step naming both, localised, and each model's standing; the
nightly's drafted report for them says so too. A wrong operator localised in a PASS whose output
agrees with the reference is a step all the same (issue 56, part 4): tiny-qwen3 with every
``aten::mul.Tensor`` wrong PASSes (its flat logits tie), ``ops`` said it "runs on the device"
with no step; after ``localise`` names the multiplication, ``ops`` lists it as a step, the model
"computes wrong numbers", and ``ops --prove`` confirms the step like any other. The ranking of
wrong and missing operators together runs on made-up censuses."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import pretend_cli

REPO = Path(__file__).resolve().parents[1]
STACK = {"wrong_ops": ["aten::rsqrt"]}
MODELS = ("tiny-llama", "tiny-qwen2", "tiny-gpt2")
VARIANT = "eager+dynamic+2t"  # max_new_tokens 2


def cli(args: list, data: Path, stack: dict | None = STACK) -> subprocess.CompletedProcess:
    """The command line for real, with the pretend stack ``stack`` in its environment (None:
    unset); it must exit 0."""
    return pretend_cli(args, data, stack, check=True, threads=1, timeout=600)


def names(keys) -> list[str]:
    """Fixture names from plan keys (``local:tiny-llama [eager+dynamic+2t]``)."""
    return sorted(k.removeprefix("local:").split(" [")[0] for k in keys)


@pytest.fixture(scope="module")
def wrong_sweep(tmp_path_factory, fixture_models) -> dict:
    """The sweep, ``ops`` before localise, a localise of each diverging PASS, ``ops`` and the
    report after."""
    import yaml

    from model_support.record import store

    tmp = tmp_path_factory.mktemp("plan-wrong")
    data = tmp / "data"
    probe = {
        "device": "pretend",
        "max_new_tokens": 2,
        "reference": "cpu",
        "judge": False,
        "perf": False,
    }
    definition = tmp / "wrong.yaml"
    models = [str(REPO / "data" / "models" / m) for m in MODELS]
    definition.write_text(
        yaml.safe_dump({"name": "wrong", "probe": probe, "models": models, "workers": 1})
    )
    cli(["sweep", str(definition), "--no-report"], data)
    (sweep,) = store.list_sweeps(data)
    records = {r["model_id"].removeprefix("local:"): r for r in store.read_records(data, sweep)}
    before = json.loads(cli(["ops", sweep, "--json"], data).stdout)
    before_text = cli(["ops", sweep], data).stdout
    with ThreadPoolExecutor(max_workers=2) as pool:  # what the not-localised line says to run, run
        commands = [c["command"].split()[1:] for c in before["not_localised"]]
        # the model's one variant, found by localise
        commands[-1] = commands[-1][: commands[-1].index("--variant")]
        list(pool.map(lambda args: cli(args, data), commands))
    # the sweep's data alone
    after = json.loads(cli(["ops", sweep, "--json"], data, stack=None).stdout)
    text = cli(["ops", sweep], data, stack=None).stdout
    cli(["report", sweep, "--baseline", ""], data, stack=None)
    report = (data / "reports" / f"{sweep}.html").read_text()
    return {
        "data": data,
        "sweep": sweep,
        "records": records,
        "before": before,
        "before_text": before_text,
        "after": after,
        "text": text,
        "report": report,
    }


@pytest.mark.slow
def test_two_diverging_passes_unlocalised_are_said_with_the_commands_that_localise_them(
    wrong_sweep,
):
    records, before, sweep = wrong_sweep["records"], wrong_sweep["before"], wrong_sweep["sweep"]
    assert {n: (r["status"], r["numerics"]) for n, r in records.items()} == {
        "tiny-llama": ("PASS", "diverges"),
        "tiny-qwen2": ("PASS", "diverges"),
        "tiny-gpt2": ("PASS", "match"),
    }
    assert before["plan"] == []  # nothing localised: no operator is named, and none is guessed
    assert [(n["model"], n["command"]) for n in before["not_localised"]] == [
        (f"local:{m} [{VARIANT}]", f"model-support localise {sweep} local:{m} --variant {VARIANT}")
        for m in ("tiny-llama", "tiny-qwen2")
    ]
    said = " ".join(wrong_sweep["before_text"].split())
    assert (
        f"2 diverging PASSes not localised: run model-support localise {sweep} local:tiny-llama"
        in said
    )
    assert {names([k])[0]: s for k, s in before["standing"].items()} == {
        "tiny-gpt2": "runs on the device",
        "tiny-llama": "blocked by wrong numbers (not localised)",
        "tiny-qwen2": "blocked by wrong numbers (not localised)",
    }


@pytest.mark.slow
def test_a_localised_wrong_operator_is_a_step_of_ops_naming_both_models(wrong_sweep):
    after, data, sweep = wrong_sweep["after"], wrong_sweep["data"], wrong_sweep["sweep"]
    # localise kept its answers in the sweep's own folder, one per model
    kept = sorted(p.name for p in (data / "sweeps" / sweep / "localised").glob("*.json"))
    assert kept == [f"local_{m}@eager_dynamic_2t.json" for m in ("tiny-llama", "tiny-qwen2")]
    (step,) = after["plan"]
    assert (step["op"], step["faults"], step["passing"]) == (
        "aten::rsqrt",
        {"aten::rsqrt": "wrong"},
        3,
    )
    assert names(step["unlocks"]) == names(step["blocks"]) == ["tiny-llama", "tiny-qwen2"]
    assert names(step["localised"]["aten::rsqrt"]) == ["tiny-llama", "tiny-qwen2"]
    assert after["passing"] == 1 and after["not_localised"] == [] and after["blocked"] == []
    assert {names([k])[0]: s for k, s in after["standing"].items()} == {
        "tiny-gpt2": "runs on the device",
        "tiny-llama": "blocked by wrong numbers (localised: aten::rsqrt)",
        "tiny-qwen2": "blocked by wrong numbers (localised: aten::rsqrt)",
    }
    text = wrong_sweep["text"]
    plan = text[text.index("What to implement next") :].splitlines()
    # the column, unwrapped
    fix = " ".join(line.split("│")[2].strip() for line in plan if line.startswith("│"))
    assert fix == "aten::rsqrt for f32, 3 dims (wrong numbers in 2 models, localised)"
    # a variant's brackets printed, not read as markup
    assert "tiny-llama [eager+dynamic+2t]" in " ".join(plan)
    assert "Nothing to fix" not in text


@pytest.mark.slow
def test_the_reports_plan_section_lists_the_localised_wrong_operator(wrong_sweep):
    report = wrong_sweep["report"]
    section = report[report.index('id="what-to-implement-next"') :]
    section = section[: section.index("Operators gained or lost")]
    plan = " ".join(re.sub(r"<[^>]+>", " ", section[section.index("The porting plan") :]).split())
    assert "aten::rsqrt for f32, 3 dims (wrong numbers in 2 models, localised)" in plan
    row = plan[plan.index("aten::rsqrt for f32") : plan.index("What no step unlocks")]
    assert "tiny-llama" in row and "tiny-qwen2" in row and "tiny-gpt2" not in row
    assert "Nothing to fix" not in plan
    assert "blocked by wrong numbers (localised: aten::rsqrt)" in plan  # each model's standing


@pytest.mark.slow
def test_the_nightlys_draft_says_the_step_and_that_localise_found_it(wrong_sweep):
    from model_support import nightly

    data, sweep = wrong_sweep["data"], wrong_sweep["sweep"]
    changes = [
        {
            "model_id": f"local:{m}",
            "variant": VARIANT,
            "before": "PASS",
            "after": "suspect PASS",
            "signature": None,
        }
        for m in ("tiny-llama", "tiny-qwen2")
    ]
    (path,) = nightly._draft(data, "wrong", sweep, sweep, changes, False, None, lambda _: None)
    draft = " ".join(path.read_text().split())
    assert "## In the porting plan" in draft
    fix = (
        "fix aten::rsqrt for f32, 3 dims (wrong numbers in 2 models, localised by `model-support "
        "localise`)"
    )
    assert fix in draft
    assert f"tiny-llama [{VARIANT}]: blocked by wrong numbers (localised: aten::rsqrt)" in draft


# --- a PASS row with a localised wrong operator (issue 56, part 4)
# -----------------------------------------------

MUL = "aten::mul.Tensor"
MUL_STACK = {"wrong_ops": [MUL]}


@pytest.fixture(scope="module")
def pass_row(tmp_path_factory, fixture_models) -> dict:
    """tiny-qwen3 with every ``aten::mul.Tensor`` wrong: its PASS (its flat logits agree with the
    reference all the same), ``ops`` before localise, ``localise`` as the user types it, ``ops``
    after, ``ops --prove``."""
    import yaml

    from model_support.record import store

    tmp = tmp_path_factory.mktemp("plan-pass-row")
    data = tmp / "data"
    probe = {
        "device": "pretend",
        "max_new_tokens": 2,
        "reference": "cpu",
        "judge": False,
        "perf": False,
    }
    definition = tmp / "mul.yaml"
    models = [fixture_models["tiny-qwen3"]["path"]]
    definition.write_text(
        yaml.safe_dump({"name": "mul", "probe": probe, "models": models, "workers": 1})
    )
    cli(["sweep", str(definition), "--no-report"], data, MUL_STACK)
    (sweep,) = store.list_sweeps(data)
    (record,) = store.read_records(data, sweep)
    before = json.loads(cli(["ops", sweep, "--json"], data, stack=None).stdout)
    localised = cli(["localise", sweep, "tiny-qwen3"], data, MUL_STACK).stdout
    after = json.loads(cli(["ops", sweep, "--json"], data, stack=None).stdout)
    text = cli(["ops", sweep], data, stack=None).stdout
    proved = json.loads(cli(["ops", sweep, "--prove", "--json"], data, MUL_STACK).stdout)
    return {
        "record": record,
        "before": before,
        "localised": localised,
        "after": after,
        "text": text,
        "proved": proved,
    }


@pytest.mark.slow
def test_ops_lists_a_localised_wrong_operator_on_a_pass_row_as_a_step(pass_row):
    record, before, after, text = (
        pass_row["record"],
        pass_row["before"],
        pass_row["after"],
        pass_row["text"],
    )
    assert record["status"] == "PASS"
    # the reference check let it through: nothing but localise says it
    if record["numerics"] in ("match", "ties"):
        assert before["plan"] == [] and list(before["standing"].values()) == ["runs on the device"]
    assert pass_row["localised"].startswith("The first wrong operator of")
    assert "aten::mul (Tensor)" in pass_row["localised"].splitlines()[0]
    (step,) = after["plan"]
    assert (step["op"], step["faults"]) == (MUL, {MUL: "wrong"})
    assert names(step["unlocks"]) == names(step["localised"][MUL]) == ["tiny-qwen3"]
    assert after["passing"] == 0  # a PASS computing wrong numbers is no predicted PASS of the plan
    (standing,) = after["standing"].values()
    agrees = record["numerics"] in ("match", "ties")
    said = "computes wrong numbers" if agrees else "blocked by wrong numbers"
    assert standing.startswith(f"{said} (localised: {MUL})"), standing
    plan = text[text.index("What to implement next") :].splitlines()
    # the column, unwrapped
    fix = " ".join(line.split("│")[2].strip() for line in plan if line.startswith("│"))
    assert fix.startswith(f"{MUL} for ") and fix.endswith("(wrong numbers in 1 model, localised)")
    assert "Nothing to fix" not in text


@pytest.mark.slow
def test_the_pass_rows_step_is_proven_like_the_others(pass_row):
    (step,) = pass_row["proved"]["plan"]
    assert step["proof"]["outcome"] == "confirmed", step["proof"]["said"]
    (standing,) = pass_row["proved"]["standing"].values()
    assert standing.startswith(f"runs with 1 operator on the host ({MUL}")


# --- the ranking, on made-up censuses
# ---------------------------------------------------------------------


def _model(key, ops, missing=(), localised=None, numerics="diverges", status="PASS"):
    from model_support.ops import ModelOps

    return ModelOps(
        key=key,
        status=status,
        device_type="pretend",
        ops=list(ops),
        stages=["generate"] * len(ops),
        calls=[1] * len(ops),
        source="run" if status == "PASS" else "reference",
        ops_missing=list(missing),
        attribution=None if status == "PASS" else "stack",
        numerics=numerics if status == "PASS" else None,
        localised=localised,
        sweep_id="s",
        model_id=key,
    )


def test_wrong_and_missing_operators_rank_together_and_a_model_needing_both_waits_for_both():
    """rsqrt, localised wrong in b1 and b2, unlocks two models; gelu, missing, one: rsqrt goes
    first. ``both`` lacks gelu and was localised wrong at rsqrt: unlocked by the second step
    only. A PASS whose output matches the reference is blocked by an operator localise flagged in
    it all the same (issue 56: flat logits agree with any kernel; the operator is wrong for every
    prompt): it "computes wrong numbers", a step unlocks it; a diverging PASS never localised is
    said."""
    from model_support.ops import porting_plan, predict
    from model_support.ops.plan import not_localised_line, plan_json, standing

    mm, rsqrt, gelu = "aten::mm", "aten::rsqrt", "aten::gelu"
    models = predict(
        [
            _model("b1", [mm, rsqrt], localised=[rsqrt]),
            _model("b2", [mm, rsqrt], localised=[rsqrt]),
            _model("c", [mm, gelu], missing=[gelu], status="FAIL(gen)"),
            _model(
                "both", [mm, rsqrt, gelu], missing=[gelu], status="FAIL(gen)", localised=[rsqrt]
            ),
            _model("right", [mm, rsqrt], localised=[rsqrt], numerics="match"),
            _model("unseen", [mm, rsqrt]),
        ]
    )
    steps = porting_plan(models)
    assert [(s.op, s.unlocks, s.blocks, s.passing) for s in steps] == [
        (rsqrt, ["b1", "b2", "right"], ["b1", "b2", "both", "right"], 3),
        (gelu, ["both", "c"], ["both", "c"], 5),
    ]
    assert (
        steps[0].fault(rsqrt) == "wrong numbers in 4 models, localised"
        and steps[1].fault(gelu) == ""
    )
    by = {m.key: m for m in models}
    assert (
        standing(by["both"])
        == "blocked by missing ops (aten::gelu) and wrong numbers (localised: aten::rsqrt)"
    )
    assert standing(by["right"]) == (
        "computes wrong numbers (localised: aten::rsqrt), though its output agrees with the "
        "CPU reference (match)"
    )
    assert standing(by["c"]) == "blocked by missing ops (aten::gelu)"
    assert standing(by["unseen"]) == "blocked by wrong numbers (not localised)"
    assert (
        not_localised_line(models)
        == "1 diverging PASS not localised: run model-support localise s unseen"
    )
    assert plan_json(models, steps)["plan"][0]["localised"] == {
        rsqrt: ["b1", "b2", "both", "right"]
    }


def test_another_stacks_prediction_reads_its_coverage_not_the_sweeps_localised_answers():
    """``ops --on DEVICE`` predicts another stack: what localise found on the sweep's stack says
    nothing of it."""
    from model_support.ops import porting_plan, predict
    from model_support.record.ops_table import IMPLEMENTED

    rsqrt = "aten::rsqrt"
    models = predict(
        [_model("b1", ["aten::mm", rsqrt], localised=[rsqrt])],
        dict.fromkeys(["aten::mm", rsqrt], IMPLEMENTED),
    )
    assert porting_plan(models) == [] and models[0].passes
