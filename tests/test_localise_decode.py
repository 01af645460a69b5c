"""The localiser follows the run to where it first goes wrong (issue 56, part 3; docs/debugging.md).

``model-support localise`` replays the run, not only the prompt's forward: the prompt, then the
record's generated tokens one decode step at a time through the KV cache, each operator judged; it
names the first wrong one with the step it ran in, and proves the chain of wrong operators with the
same judgement ``ops --prove`` gives a what-if run, so ``localise``, ``ops --prove`` and the plan
agree.

For real, as users type it, on the pretend device:

- tiny-llama with ``_safe_softmax`` wrong from 29 key positions on (``wrong_past_length``): its
  prompt has 26 tokens, so the run diverges at step 3. Before, ``localise`` said "No operator is
  wrong: all 263 operators ... agree" and ``ops`` "Nothing to fix"; now it names
  ``aten::_safe_softmax`` at step 3, confirms it, and the plan lists it.
- SmolLM2-135M-Instruct with ``aten::silu`` wrong and ``_safe_softmax`` wrong from 38 positions (35
  prompt tokens: step 3). Before, ``localise`` confirmed silu alone from the prompt's forward, ``ops
  --prove`` said "not confirmed: ... diverges" and the plan "blocked by something no host operator
  fixes"; now all three name both operators and agree: the chain is confirmed as a whole, the step
  of both is confirmed, the model runs with both on the host.
- A record whose long-text check diverged at position 39 (the verdict's tokens never get there): the
  long text's decode path is replayed to that position and ``_safe_softmax`` named there (skipped
  where this tree has no ``probe.long_text``).

Each chain runs in its own processes, side by side (four new tokens: the divergences sit at step 3).
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import pretend_cli

REPO = Path(__file__).resolve().parents[1]
SOFTMAX = "aten::_safe_softmax"
SILU = "aten::silu"
#: The stacks: a softmax wrong once its keys reach N positions, and with it a wrong silu.
LLAMA_STACK = {"wrong_past_length": {SOFTMAX: 29}}
SMOL_STACK = {"wrong_ops": [SILU], "wrong_past_length": {SOFTMAX: 38}}
LONG_STACK = {"wrong_past_length": {SOFTMAX: 40}}
PROBE = {
    "device": "pretend",
    "max_new_tokens": 4,
    "reference": "cpu",
    "judge": False,
    "perf": False,
}
SMOL = "SmolLM2-135M-Instruct"


def cli(args: list, data: Path, stack: dict | None) -> subprocess.CompletedProcess:
    """The command line for real, with the pretend stack ``stack`` in its environment (None:
    unset); it must exit 0."""
    return pretend_cli(args, data, stack, check=True, threads=1, timeout=600)


def swept(tmp: Path, name: str, model_path: str, stack: dict) -> tuple[Path, str, dict]:
    """A one-model sweep on ``stack``: (data folder, sweep id, its record)."""
    import yaml

    from model_support.record import store

    data = tmp / "data"
    definition = tmp / f"{name}.yaml"
    definition.write_text(
        yaml.safe_dump({"name": name, "probe": PROBE, "models": [model_path], "workers": 1})
    )
    cli(["sweep", str(definition), "--no-report"], data, stack)
    (sweep,) = store.list_sweeps(data)
    (record,) = store.read_records(data, sweep)
    return data, sweep, record


def llama_chain(tmp: Path, path: str) -> dict:
    """tiny-llama's softmax case: the sweep, ``localise`` as typed, then ``ops`` from the sweep's
    data alone."""
    from model_support.debug import localise

    data, sweep, record = swept(tmp, "softmax", path, LLAMA_STACK)
    printed = cli(["localise", sweep, "tiny-llama"], data, LLAMA_STACK).stdout.splitlines()
    answer = localise.stored(data, sweep, record["model_id"], record["variant"])
    ops = json.loads(cli(["ops", sweep, "--json"], data, None).stdout)
    text = cli(["ops", sweep], data, None).stdout
    return {"record": record, "printed": printed, "answer": answer, "ops": ops, "text": text}


def smol_chain(tmp: Path, path: str) -> dict:
    """SmolLM2's case: the sweep, ``localise``, ``ops``, ``ops --prove``, then ``ops`` from the
    sweep's data alone."""
    from model_support.debug import localise

    data, sweep, record = swept(tmp, "smol", path, SMOL_STACK)
    printed = cli(["localise", sweep, "SmolLM2"], data, SMOL_STACK).stdout.splitlines()
    answer = localise.stored(data, sweep, record["model_id"], record["variant"])
    planned = json.loads(cli(["ops", sweep, "--json"], data, None).stdout)
    proved = json.loads(cli(["ops", sweep, "--prove", "--json"], data, SMOL_STACK).stdout)
    after = json.loads(cli(["ops", sweep, "--json"], data, None).stdout)
    return {
        "record": record,
        "printed": printed,
        "answer": answer,
        "planned": planned,
        "proved": proved,
        "after": after,
    }


@pytest.fixture(scope="module")
def chains(tmp_path_factory, fixture_models) -> dict:
    """Both cases, each chain of commands in its own processes, side by side."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        llama = pool.submit(
            llama_chain, tmp_path_factory.mktemp("softmax"), fixture_models["tiny-llama"]["path"]
        )
        smol = pool.submit(
            smol_chain, tmp_path_factory.mktemp("smol"), fixture_models[SMOL]["path"]
        )
        return {"llama": llama.result(), "smol": smol.result()}


def diverging_step(record: dict, positions: int) -> int:
    """The step whose forward first reads ``positions`` keys: the prompt's forward reads
    ``tokens_in``."""
    return positions - record["tokens_in"]


@pytest.mark.slow
def test_a_softmax_wrong_from_29_positions_is_named_at_the_step_where_the_run_diverges(chains):
    from model_support.debug import localise_words

    case = chains["llama"]
    record, answer, printed = case["record"], case["answer"], case["printed"]
    step = diverging_step(record, 29)
    assert step > 0 and (record["status"], record["numerics"], record["numerics_step"]) == (
        "PASS",
        "diverges",
        step,
    )
    assert printed == localise_words.answer_lines(answer)  # as typed: the stored answer, printed
    assert (answer["operator"], answer["overload"], answer.get("step")) == (
        SOFTMAX,
        "default",
        step,
    ), answer["summary"]
    assert answer["module_class"] == "LlamaAttention" and {
        w["operator"] for w in answer["wrong_ops"]
    } == {SOFTMAX}
    where = (
        f"at step {step} (a decode step over 29 positions; the run diverged from the CPU reference "
        "there)"
    )
    assert answer["summary"].startswith(
        f"The first wrong operator of {answer['ops_checked']} checked is {SOFTMAX}"
    )
    assert where in answer["summary"] and "No operator is wrong" not in answer["summary"]
    assert answer["steps_run"] == step + 1 and answer["replay"]["steps"] == len(
        record["output_token_ids"]
    )
    proof = answer["proof"]
    assert (proof["verdict"], [link["name"] for link in proof["chain"]]) == ("confirmed", [SOFTMAX])
    # the whole run replayed with the softmax on the host, its output judged
    (rerun,) = proof["reruns"]
    assert (rerun["steps_run"], rerun["numerics"], rerun["ops_wrong"]) == (
        len(record["output_token_ids"]),
        "match",
        0,
    )
    assert printed[-1].startswith(
        f"confirmed: with {SOFTMAX} on the host the model matches the reference: its output"
    )
    assert f"at each of the {rerun['steps_run']} steps of the run (numerics match)" in printed[-1]


@pytest.mark.slow
def test_the_softmax_localised_in_a_decode_step_is_a_step_of_the_plan(chains):
    ops, text = chains["llama"]["ops"], chains["llama"]["text"]
    (step,) = ops["plan"]
    assert (step["op"], step["faults"]) == (SOFTMAX, {SOFTMAX: "wrong"})
    assert [k.removeprefix("local:").split(" [")[0] for k in step["localised"][SOFTMAX]] == [
        "tiny-llama"
    ]
    plan = text[text.index("What to implement next") :].splitlines()
    # the column, unwrapped
    fix = " ".join(line.split("│")[2].strip() for line in plan if line.startswith("│"))
    assert fix.startswith(SOFTMAX) and fix.endswith("(wrong numbers in 1 model, localised)")
    assert "Nothing to fix" not in text


@pytest.mark.slow
def test_localise_names_both_wrong_operators_each_where_it_first_goes_wrong_and_confirms_the_chain(
    chains,
):
    from model_support.debug import localise, localise_words

    case = chains["smol"]
    record, answer, printed = case["record"], case["answer"], case["printed"]
    assert printed == localise_words.answer_lines(answer)
    assert (record["status"], record["numerics"]) == ("PASS", "diverges")
    # wrong from the prompt's forward on
    assert (answer["operator"], answer.get("step")) == ("aten::silu", 0)
    proof = answer["proof"]
    assert [(link["name"], link["step"]) for link in proof["chain"]] == [
        (SILU, 0),
        # met only in a decode step: the prompt's forward reads 35 keys
        (SOFTMAX, diverging_step(record, 38)),
    ]
    assert (proof["verdict"], proof["matches"], proof["on_host"]) == (
        "confirmed",
        True,
        [SILU, SOFTMAX],
    )
    # the first rerun stopped at the softmax
    assert [r["numerics"] for r in proof["reruns"]] == [None, "match"]
    assert proof["reruns"][-1]["steps_run"] == len(record["output_token_ids"])
    (enough,) = [line for line in printed if line.startswith("not enough:")]
    assert (
        f"with {SILU} on the host the run still goes wrong at step {diverging_step(record, 38)}"
        in enough
    )
    assert printed[-1].startswith(
        f"confirmed: with {SILU} and {SOFTMAX} on the host the model matches the reference"
    )
    assert localise.localised_answers.wrong_ops(answer)[:2] == [SILU, SOFTMAX]


@pytest.mark.slow
def test_localise_ops_prove_and_the_plan_agree_and_name_both_operators(chains):
    case = chains["smol"]
    planned, proved, after = case["planned"], case["proved"], case["after"]
    (step,) = planned["plan"]  # one step: the two only unlock together
    assert sorted(step["ops"]) == [SOFTMAX, SILU] and set(step["localised"]) == {SOFTMAX, SILU}
    assert step["faults"] == {SOFTMAX: "wrong", SILU: "wrong"}
    (standing,) = planned["standing"].values()
    assert (
        standing.startswith("blocked by wrong numbers (localised: ")
        and SILU in standing
        and SOFTMAX in standing
    )
    (proven,) = proved["plan"]
    assert proven["proof"]["outcome"] == "confirmed", proven["proof"]["said"]
    (standing,) = after["standing"].values()
    assert standing.startswith("runs with 2 operators on the host") and "blocked" not in standing
    assert SOFTMAX in standing and SILU in standing


# --- a long-text divergence, from a record that says where
# ------------------------------------------------------


@pytest.mark.slow
def test_a_long_text_divergence_is_replayed_to_its_position(tmp_path, fixture_models):
    """The verdict's two tokens reach 27 keys and agree; the record's long-text check diverged at
    position 39 on its decode path (a softmax wrong from 40 keys). ``localise`` replays the long
    text's ids through the KV cache to position 39, checking the last few positions, and names
    the softmax there."""
    long_text = pytest.importorskip("model_support.probe.long_text")
    if not hasattr(long_text, "token_ids"):
        pytest.skip("this tree's long-text check names no token_ids")
    from test_localise import pretend_sweep

    from model_support.debug import localise
    from model_support.record import store

    data = tmp_path / "data"
    # sweep s, a PASS record of tiny-llama
    pretend_sweep(data, fixture_models["tiny-llama"]["path"], LONG_STACK)
    (path,) = (store.sweep_dir(data, "s") / "records").glob("*.json")
    record = json.loads(path.read_text())
    said = {
        "long_text_tokens": 48,
        "long_text_decode_diverges_at": 39,
        "long_text_first_disagreement": 39,
    }
    record.update(numerics="match", output_token_ids=[5, 6], **said)
    path.write_text(json.dumps(record))
    printed = cli(["localise", "s", "tiny-llama"], data, LONG_STACK).stdout.splitlines()
    answer = localise.stored(data, "s", "local:tiny-llama")
    assert (answer["operator"], answer.get("step")) == (SOFTMAX, 39), answer["summary"]
    assert answer["replay"]["what"] == "the long text's decode path" and answer["steps_run"] == 40
    assert (
        "at position 39 (a decode step over 40 positions; the long-text check's decode path "
        "diverged" in printed[0]
    )
    assert answer["proof"]["verdict"] == "confirmed"
    assert (
        "at each of the 40 positions of the long text's decode path (numerics match)" in printed[-1]
    )


# --- which divergence the replay chases, from the record
# ---------------------------------------------------------


def test_the_replay_chases_the_verdicts_divergence_first_and_says_a_long_text_one_it_does_not_reach():
    from model_support.debug.localise import replay_of

    verdict = {
        "numerics": "diverges",
        "numerics_step": 3,
        "first_divergence": 3,
        "output_token_ids": [9, 8, 7, 6],
    }
    replay = replay_of(verdict)
    assert (replay.tokens, replay.steps, replay.diverged_at, replay.unreached) == (
        [9, 8, 7, 6],
        4,
        3,
        None,
    )
    assert replay.how == "the run diverged from the CPU reference" and replay.prompt_ids is None
    both = replay_of({**verdict, "long_text_tokens": 1024, "long_text_decode_diverges_at": 600})
    assert both.diverged_at == 3 and both.prompt_ids is None  # the probe's own run first
    assert (
        "decode path diverged from the CPU reference at position 600 of its text" in both.unreached
    )
    ties = {
        "numerics": "ties",
        "numerics_step": 1,
        "first_divergence": 1,
        "output_token_ids": [9, 8],
    }
    assert (replay_of(ties).diverged_at, replay_of(ties).how) == (
        1,
        "the run first chose another token than the CPU",
    )
    # no tokenizer at hand: not to be had, said
    lost = replay_of({**ties, "long_text_decode_diverges_at": 39})
    assert lost.prompt_ids is None and lost.unreached.endswith(
        "(the long text's ids are not to be had here)"
    )
    # nothing generated: the prompt's forward
    failed = replay_of({"status": "FAIL(gen)", "output_token_ids": None})
    assert (failed.tokens, failed.steps, failed.diverged_at, failed.unreached) == (
        [],
        1,
        None,
        None,
    )


def test_a_long_text_divergence_is_replayed_on_its_own_path_to_its_position(fixture_models):
    long_text = pytest.importorskip("model_support.probe.long_text")
    if not hasattr(long_text, "token_ids"):
        pytest.skip("this tree's long-text check names no token_ids")
    from transformers import AutoTokenizer

    from model_support.debug.localise import LONG_TEXT_CHECKED, replay_of

    tokenizer = AutoTokenizer.from_pretrained(fixture_models["tiny-llama"]["path"])
    ids = long_text.token_ids(tokenizer, 48, None)
    record = {"numerics": "match", "output_token_ids": [9, 8], "long_text_tokens": 48}
    decode = replay_of({**record, "long_text_decode_diverges_at": 39}, tokenizer)
    assert (decode.prompt_ids, decode.tokens[:-1], decode.steps) == (ids[:1], ids[1:40], 40)
    assert (decode.diverged_at, decode.unit, decode.check_from) == (
        39,
        "position",
        40 - LONG_TEXT_CHECKED,
    )
    # the text's last position
    last = replay_of({**record, "long_text_decode_diverges_at": 47}, tokenizer)
    assert last.steps == 48 and last.tokens[:-1] == ids[1:48]
    prefill = replay_of({**record, "long_text_prefill_diverges_at": 20}, tokenizer)
    assert (prefill.prompt_ids, prefill.tokens, prefill.steps) == (ids[:21], [], 1)
    assert prefill.what == "the long text's prefill up to position 20"
