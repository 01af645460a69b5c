"""The probe over several devices, for real: 2 gloo ranks on this CPU, launched by
model_support.probe.sharded.

Tensor parallel (tiny-llama) and expert parallel (a tiny Mixtral, both of transformers 5.24's EP
layouts) against the one-process probe; the device count a small device memory forces; a model with
no parallel plan; a rank killed mid-generation and a rank that hangs, each ending as FAIL(other)
naming the rank with no process of the run left. Each 2-rank run takes ~8 s here (two fresh
processes importing torch and transformers on 2 cores), the two hang tests ~50 s each (their
timeouts leave room for a busy host): about 3.5 minutes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import psutil
import pytest

from fixtures.sharded_fixtures import DEVICE_MEMORY_BYTES, SHARDED_FIXTURES
from model_support.paths import checkout_root
from model_support.probe import probe_core, sharded

pytestmark = pytest.mark.slow


def _one_process(path, dtype):
    """The probe's own stages in this process: the reference a sharded run must match."""
    import torch

    result = probe_core.run_stages(str(path), dtype=dtype, device=torch.device("cpu"))
    assert result["status"] == probe_core.PASS, result["exception"]
    return result


def _of_a_run(process) -> bool:
    """A process a sharded run starts (its launcher, agent or ranks), not one another fixture holds
    (the session's Chromium, for one)."""
    try:
        return "model_support.probe.sharded" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def _assert_nothing_left(result):
    """No process of the run survives: not the launcher, not a rank, not a child of this process."""
    deadline = time.monotonic() + 10
    pids = [result["launcher_pid"], *result["rank_pids"]]
    while time.monotonic() < deadline:
        alive = [
            p
            for p in pids
            if p and psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        children = [
            c
            for c in psutil.Process().children(recursive=True)
            if c.status() != psutil.STATUS_ZOMBIE and _of_a_run(c)
        ]
        if not alive and not children:
            return
        time.sleep(0.2)
    raise AssertionError(f"left behind: pids {alive}, children {children}")


@pytest.fixture(scope="session")
def sharded_models(tmp_path_factory) -> dict:
    """The builders of testing/sharded_fixtures.py, run into a fresh folder: name -> path and
    manifest keys."""
    from fixtures.tiny import _atomic_build, _Context

    root = tmp_path_factory.mktemp("sharded-models")
    ctx = _Context(root)
    built = {}
    for spec in SHARDED_FIXTURES:
        final = root / spec["name"]
        extra = _atomic_build(
            final, lambda tmp, spec=spec, final=final: spec["build"](tmp, final, ctx)
        )
        built[spec["name"]] = {"path": str(final), **extra}
    return built


@pytest.fixture(scope="session")
def tiny_llama(fixture_models) -> str:
    return fixture_models["tiny-llama"]["path"]


# --- planning: no process started
# ------------------------------------------------------------------


def test_plan_devices_picks_the_fewest_powers_of_two():
    gib = 2**30
    # 1e9 bf16 parameters: 2 GB of weights, 2.4 GB with the 20% margin
    assert sharded.plan_devices(10**9, "bfloat16", 3 * gib, 8) == 1
    assert sharded.plan_devices(10**9, "bfloat16", 2 * gib, 8) == 2
    assert sharded.plan_devices(10**9, "float32", 2 * gib, 8) == 4  # 4.8 GB
    # powers of two only: 1, 2, 4 of 6
    assert sharded.plan_devices(10**9, "float32", 2 * gib, 6) == 4
    assert sharded.plan_devices(10**9, "bfloat16", 2 * gib, 8, margin=0.0) == 1  # 2.0e9 < 2 GiB
    with pytest.raises(sharded.DoesNotFit, match=r"more than 4 device\(s\) of 0\.5 GiB hold"):
        sharded.plan_devices(10**9, "bfloat16", gib // 2, 7)


def test_estimate_params_from_headers_and_from_config(tiny_llama):
    headers = sharded.safetensors_params(tiny_llama)
    assert headers == sharded.estimate_params(tiny_llama)
    assert headers == sharded.config_params(tiny_llama, "", False)  # the meta-device count agrees
    assert headers == _one_process(tiny_llama, "float32")["num_params"]


def test_fixtures_need_two_small_devices(sharded_models):
    for name, built in sharded_models.items():
        params = sharded.estimate_params(built["path"])
        assert params == built["num_params"]
        # ~0.7M parameters, ~1.4 MB of bf16 weights, ~1.7 MB with the margin: 2 devices of 1 MB,
        # ~0.85 MB each
        assert sharded.plan_devices(params, "bfloat16", DEVICE_MEMORY_BYTES, 8) == 2, name
        with pytest.raises(sharded.DoesNotFit):
            sharded.plan_devices(params, "bfloat16", DEVICE_MEMORY_BYTES, 1)


def test_parallelism_for_the_plans_transformers_ships():
    from transformers import AutoConfig, GPT2LMHeadModel, LlamaForCausalLM

    assert sharded.parallelism_for(AutoConfig.for_model("llama"))[0] == "tp"
    assert sharded.parallelism_for(LlamaForCausalLM)[0] == "tp"
    kind, details = sharded.parallelism_for(AutoConfig.for_model("mixtral"))
    assert (kind, details["dense"], details["model_class"]) == ("ep", "tp", "MixtralForCausalLM")
    # an expert plan and no tensor plan
    kind, details = sharded.parallelism_for(AutoConfig.for_model("zaya"))
    assert (kind, details["dense"]) == ("ep", "fsdp")
    for no_plan in (AutoConfig.for_model("gpt2"), AutoConfig.for_model("opt"), GPT2LMHeadModel):
        assert sharded.parallelism_for(no_plan)[0] is None
    assert sharded.distributed_config("tp", None, 2) == {"tp_size": 2}
    assert sharded.distributed_config("ep", "tp", 2) == {"tp_size": 2, "ep_size": 2}
    assert sharded.distributed_config("ep", "fsdp", 2) == {"fsdp_size": 2, "ep_size": 2}


#: The launch environment torch_tpu's set_tpu_launch_env sets for 2 ranks
#: (tests/test_torch_tpu_conformance.py checks it against the package), as a rank inherits it from
#: the launcher's parent.
TPU_LAUNCH = {
    "TORCH_TPU_SLICEBUILDER_ADDRESSES": "localhost:8100,localhost:8101",
    "TORCH_TPU_TOPOLOGY": "1,2,1",
}


def test_tpu_rank_env_one_chip_per_process():
    """Each rank its own chip of the probe's grant, by TPU_VISIBLE_DEVICES (torch_tpu's runtime
    otherwise opens chip LOCAL_RANK: chips 0-1 for a probe granted 4-5), and the launch
    environment the ranks share."""
    assert sharded.tpu_rank_env(1, 2, [4, 5], TPU_LAUNCH) == {
        "TPU_VISIBLE_DEVICES": "5",
        **TPU_LAUNCH,
    }
    # unpinned: chips 0..N-1
    assert sharded.tpu_rank_env(0, 2, None, TPU_LAUNCH)["TPU_VISIBLE_DEVICES"] == "0"
    with pytest.raises(ValueError, match="2 TPU ranks need 2 chips"):
        sharded.tpu_rank_env(1, 2, [4], TPU_LAUNCH)


def test_a_tpu_rank_takes_its_processs_own_chip():
    """rank_env leaves each TPU rank one chip, at index 0 in its process: rank 1 must not ask for
    device 1 (the generic accelerators' convention, where every rank sees every device)."""
    from model_support.probe.devices.tpu import TpuAdapter

    # torch's answers in a process that sees one chip, without a TPU here
    class OneChipProcess(TpuAdapter):
        def ask(self, name, *args):
            return (
                (0, "torch.accelerator." + name) if name == "current_device_index" else (None, None)
            )

        def select(self, index):  # the device index the rank would make current
            return index

    adapter = OneChipProcess()
    assert [adapter.rank_device(rank) for rank in range(4)] == [0, 0, 0, 0]


def test_a_sharded_repro_carries_how_the_adapter_set_up_each_rank(monkeypatch):
    """The repro script's ranks get the adapter's own answers (each rank's environment, the
    process group's backend), computed in the probe process whose environment the ranks inherit;
    none where it refused."""
    from model_support.probe import run
    from model_support.probe.devices.tpu import TpuAdapter

    monkeypatch.setenv("TPU_VISIBLE_DEVICES", "4,5")
    for name, value in TPU_LAUNCH.items():
        monkeypatch.setenv(name, value)
    setup = run._rank_setup(TpuAdapter(), 2)
    assert setup["distributed_backend"] == "cpu:gloo,tpu:tpu_dist"
    assert [env["TPU_VISIBLE_DEVICES"] for env in setup["rank_env"]] == ["4", "5"]
    assert setup["rank_env"] == [
        sharded.tpu_rank_env(rank, 2, [4, 5], TPU_LAUNCH) for rank in range(2)
    ]
    # no 3-chip TPU slice: the ranks failed on it
    assert run._rank_setup(TpuAdapter(), 3)["rank_env"] is None


def test_a_tpu_probe_launches_its_ranks_with_torch_tpus_launch_environment(monkeypatch):
    """``run_sharded`` on TPU asks the adapter for the launch environment (torch_tpu's
    set_tpu_launch_env, in the probe process) and hands it to the launcher, whose ranks inherit
    it; the probe's own environment keeps none of it. Where the adapter refuses (no slice of that
    many chips), no rank starts and the sentence is the probe's."""
    from model_support.probe.devices import tpu
    from model_support.probe.sharded import launch

    calls = []
    monkeypatch.setattr(tpu, "_set_tpu_launch_env", lambda n: calls.append(n) or dict(TPU_LAUNCH))
    monkeypatch.setattr(tpu, "chip_shape", lambda n: "1,2,1")
    monkeypatch.setattr(tpu, "_LAUNCHED", {})
    assert launch.launch_environment("tpu", 2) == TPU_LAUNCH
    # once per run: the repro gets the same
    assert launch.launch_environment("tpu", 2) == TPU_LAUNCH and calls == [2]
    env = launch._child_env("tpu", 2, TPU_LAUNCH)
    assert {k: env[k] for k in TPU_LAUNCH} == TPU_LAUNCH and not set(TPU_LAUNCH) & set(os.environ)
    assert launch.launch_environment("cpu", 2) == {} and launch.launch_environment("cuda", 2) == {}

    def no_slice(n):
        raise ValueError(f"torch_tpu has no slice of {n} chips on this TPU v5e")

    monkeypatch.setattr(tpu, "chip_shape", no_slice)
    monkeypatch.setattr(tpu, "_LAUNCHED", {})
    monkeypatch.setattr(sharded.launch, "plan_run", lambda full, n, result: ("tp", {"tp_size": n}))
    result = sharded.run_sharded({"load_from": "org/model"}, 2, "tpu")
    assert (result["status"], result["failure_stage"], result["error_type"]) == (
        probe_core.FAIL_OTHER,
        "runner",
        "LaunchFailed",
    )
    assert result["error_message"] == (
        "2 tpu ranks cannot be launched here: torch_tpu has no slice of 2 chips on this TPU v5e"
    )
    assert result["launcher_pid"] is None and result["rank_pids"] == []


def test_a_sharded_run_on_a_device_playing_the_tpu_launch_contract(
    tmp_path, tiny_llama, monkeypatch
):
    """The pretend device under the TPU contract's distributed clauses (``launch_env``,
    ``one_device``: a rank with WORLD_SIZE set refuses to start without its launch environment,
    and opens one device: the single id its visibility variable names, else device LOCAL_RANK, as
    torch_tpu's runtime does). A probe granted devices 2 and 3 of 4: its ranks start with the
    launch environment set in the probe process, and each opens the device it was granted (not
    devices 0 and 1); without the launch environment, no rank starts, each saying why."""
    opened = tmp_path / "opened.jsonl"
    config = {"devices": 4, "launch_env": True, "one_device": True, "opened_log": str(opened)}
    monkeypatch.setenv("MODEL_SUPPORT_PRETEND", json.dumps(config))
    monkeypatch.setenv("PRETEND_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    two = sharded.run_sharded({"load_from": tiny_llama, "dtype": "float32"}, 2, "pretend")
    assert two["status"] == probe_core.PASS, (two["error_message"], two["rank_errors"])
    assert (two["devices_used"], two["parallelism"], two["ranks_agree"]) == (2, "tp", True)
    assert two["output_token_ids"] == _one_process(tiny_llama, "float32")["output_token_ids"]
    seen = sorted(
        (json.loads(line) for line in opened.read_text().splitlines()), key=lambda r: r["rank"]
    )
    assert [(r["rank"], r["world_size"], r["opened"]) for r in seen] == [
        ("0", "2", [2]),
        ("1", "2", [3]),
    ]
    assert (
        seen[0]["launch"] == seen[1]["launch"] and seen[0]["launch"]["PRETEND_TOPOLOGY"] == "1,2,1"
    )
    assert len(seen[0]["launch"]["PRETEND_LAUNCH_ADDRESSES"].split(",")) == 2
    # the probe's own environment is left as it was
    assert "PRETEND_LAUNCH_ADDRESSES" not in os.environ
    _assert_nothing_left(two)

    from model_support_pretend.adapter import PretendAdapter

    # a launcher that sets none
    monkeypatch.setattr(PretendAdapter, "launch_env", lambda self, world_size: {})
    refused = sharded.run_sharded({"load_from": tiny_llama, "dtype": "float32"}, 2, "pretend")
    assert (refused["status"], refused["failure_stage"]) == (probe_core.FAIL_OTHER, "runner")
    assert refused["rank_errors"] and all(  # the first to refuse; the agent then stops the other
        "pretend runtime: missing required environment variables for distributed training: "
        "PRETEND_LAUNCH_ADDRESSES, PRETEND_TOPOLOGY" in line
        for line in refused["rank_errors"]
    ), refused["rank_errors"]
    _assert_nothing_left(refused)


def test_no_plan_model_gets_its_sentence_and_no_rank_starts(sharded_models):
    result = sharded.run_sharded({"load_from": sharded_models["sharded-gpt2"]["path"]}, 2)
    assert (result["status"], result["failure_stage"], result["error_type"]) == (
        probe_core.FAIL_OTHER,
        "load",
        "NoParallelPlan",
    )
    assert result["error_message"] == (
        "GPT2LMHeadModel has no tensor or expert parallel plan, and needs 2 devices: it "
        "cannot run here as shipped"
    )
    assert result["launcher_pid"] is None and result["rank_pids"] == []


def test_unreadable_config_is_fail_load_before_any_rank(fixture_models):
    result = sharded.run_sharded(
        {"load_from": fixture_models["fail-unknown-model-type"]["path"]}, 2
    )
    assert (result["status"], result["failure_stage"]) == (probe_core.FAIL_LOAD, "load")
    assert "not-a-real-arch" in result["error_message"] and result["launcher_pid"] is None


# --- real ranks
# ----------------------------------------------------------------------------------------


def test_tensor_parallel_tiny_llama_matches_one_process(tiny_llama, record_property):
    started = time.perf_counter()
    two = sharded.run_sharded({"load_from": tiny_llama, "dtype": "float32"}, 2)
    wall = time.perf_counter() - started
    assert two["status"] == probe_core.PASS, two["traceback"]
    assert (two["parallelism"], two["tp_size"], two["ep_size"], two["devices_used"]) == (
        "tp",
        2,
        1,
        2,
    )
    assert two["distributed_config"] == {"tp_size": 2}
    one = _one_process(tiny_llama, "float32")
    # float32: reduction order across ranks cannot flip a greedy token of this model
    assert two["output_token_ids"] == one["output_token_ids"] and two["tokens_out"] == 8
    assert two["ranks_agree"] is True and two["tokens_in"] == one["tokens_in"]
    assert two["num_params"] == one["num_params"]  # DTensors count their global shape
    full_bytes = one["num_params"] * 4
    # each rank holds about half
    assert all(b < 0.6 * full_bytes for b in two["local_param_bytes_per_rank"])
    assert len(two["load_s_per_rank"]) == len(two["generate_s_per_rank"]) == 2
    assert two["peak_device_mem_mb"] is None  # CPU: nothing trustworthy to report
    assert two["memory_estimate_bytes"] == sharded.memory_estimate_bytes(
        one["num_params"], "float32"
    )
    _assert_nothing_left(two)
    record_property("wall_2_ranks_s", round(wall, 2))
    print(
        f"tiny-llama float32, 2 ranks: {wall:.1f} s wall, load {two['load_s_per_rank']}, gen "
        f"{two['generate_s_per_rank']}"
    )


def test_tensor_parallel_bf16_agreement_is_recorded(tiny_llama, record_property):
    """bf16 over 2 ranks sums partial products in another order than 1 process: a greedy token may
    legitimately flip. Asserted: the run passes with 8 tokens. Recorded: whether the tokens agree
    (on tiny-llama with transformers 5.24 and torch 2.13 they did: all 8)."""
    two = sharded.run_sharded({"load_from": tiny_llama, "dtype": "bfloat16"}, 2)
    assert two["status"] == probe_core.PASS, two["traceback"]
    assert two["tokens_out"] == 8 and two["ranks_agree"] is True
    one = _one_process(tiny_llama, "bfloat16")
    agree = sum(a == b for a, b in zip(two["output_token_ids"], one["output_token_ids"]))
    record_property("bf16_tokens_agreeing_of_8", agree)
    print(
        f"tiny-llama bf16: 2 ranks {two['output_token_ids']}, 1 process "
        f"{one['output_token_ids']}: {agree}/8 agree"
    )


def test_moe_runs_expert_parallel(sharded_models):
    path = sharded_models["sharded-mixtral"]["path"]
    two = sharded.run_sharded({"load_from": path, "dtype": "float32"}, 2)
    assert two["status"] == probe_core.PASS, two["traceback"]
    assert (two["parallelism"], two["tp_size"], two["ep_size"]) == ("ep", 2, 2)
    # 4 whole experts per layer, 2 on each rank
    assert two["local_experts_per_rank"] == [[2, 2], [2, 2]]
    assert two["output_token_ids"] == _one_process(path, "float32")["output_token_ids"]
    _assert_nothing_left(two)


def test_moe_expert_parallel_without_the_tensor_plan(sharded_models):
    """The layout of an MoE with an expert plan and no tensor plan: dense layers FSDP2, experts
    by EP."""
    path = sharded_models["sharded-mixtral"]["path"]
    two = sharded.run_sharded({"load_from": path, "dtype": "float32", "ep_dense": "fsdp"}, 2)
    assert two["status"] == probe_core.PASS, two["traceback"]
    assert two["distributed_config"] == {"fsdp_size": 2, "ep_size": 2}
    assert two["local_experts_per_rank"] == [[2, 2], [2, 2]]
    assert two["output_token_ids"] == _one_process(path, "float32")["output_token_ids"]


def test_a_rank_exception_is_the_verdict(sharded_models):
    """Forced tensor parallel on a model without a tensor plan: transformers refuses it on every
    rank; the probe reports that exception (rebuilt, by name, message and the rank's traceback)
    as FAIL(load)."""
    result = sharded.run_sharded(
        {"load_from": sharded_models["sharded-gpt2"]["path"], "parallelism": "tp"}, 2
    )
    assert (result["status"], result["failure_stage"], result["error_type"]) == (
        probe_core.FAIL_LOAD,
        "load",
        "ValueError",
    )
    assert result["error_message"].startswith(
        "`tp_size=2` was requested, but `GPT2LMHeadModel` has no `tp_plan`."
    )
    assert (
        isinstance(result["exception"], sharded.RankError)
        and type(result["exception"]).__name__ == "ValueError"
    )
    # the rank's traceback
    assert "_resolve_parallel_plans" in probe_core.trimmed_traceback(result["exception"])
    assert result["traceback"].startswith(f"rank {result['failed_rank']}:")
    _assert_nothing_left(result)


def test_killed_rank_is_fail_other_naming_it(tiny_llama, monkeypatch):
    # test-only: rank 1 SIGKILLs itself after 2 tokens
    monkeypatch.setenv(sharded.TEST_FAULT_ENV, "kill:1:2")
    result = sharded.run_sharded({"load_from": tiny_llama, "dtype": "float32"}, 2, timeout_s=120)
    assert (result["status"], result["failure_stage"], result["failed_rank"]) == (
        probe_core.FAIL_OTHER,
        "generate",
        1,
    )
    assert result["error_type"] == "RankDied"
    assert result["error_message"].startswith(
        "rank 1 was killed by SIGKILL (what the kernel's OOM killer sends when memory runs out) "
        "during generate, after 2 of 8 new tokens"
    )
    _assert_nothing_left(result)


def test_hung_rank_times_out_and_every_rank_is_killed(tiny_llama, monkeypatch):
    # test-only: rank 1 sleeps forever after 2 tokens
    monkeypatch.setenv(sharded.TEST_FAULT_ENV, "hang:1:2")
    # 40 s: a 2-rank run reaches its 2nd token in ~8 s on a quiet host, ~20 s beside make test's
    # other worker
    result = sharded.run_sharded({"load_from": tiny_llama, "dtype": "float32"}, 2, timeout_s=40)
    assert (result["status"], result["error_type"]) == (probe_core.FAIL_OTHER, "RankTimeout")
    message = result["error_message"]
    assert (
        "did not finish within 40 s" in message
        and "rank 1: during generate, after 2 of 8 new tokens" in message
    )
    # rank 1's stack: stuck in the step timer (the fault)
    assert "in put" in result["rank_log_tail"]
    _assert_nothing_left(result)


def test_the_models_timeout_reaches_its_ranks(tiny_llama, monkeypatch):
    """A sweep's timeout for the model bounds its ranks (what is left of it, less 15 s here), not
    a fixed 900 s: a hung rank ends as RankTimeout naming the ranks, before the probe process
    itself is killed, and the record keeps the ranks' stacks."""
    from model_support.sweep.worker.process import run_task

    # inherited by the probe process, then its ranks
    monkeypatch.setenv(sharded.TEST_FAULT_ENV, "hang:1:2")
    task = {
        "sweep_id": "s",
        "model_id": "local:tiny-llama",
        "source": tiny_llama,
        "params": {"device": "cpu", "reference": "none", "dtype": "float32", "devices": "2"},
        "variant": "eager+dynamic",
        # the ranks get what is left less 15 s: ~30 s, where they hang after 2 tokens
        "timeout_s": 45,
        "notebook_path": "sweeps/s/notebooks/tiny-llama.ipynb",
    }
    record = run_task(task).record
    assert (record["status"], record["error_type"]) == (probe_core.FAIL_OTHER, "RankTimeout"), (
        record["error_message"]
    )
    within = re.search(r"did not finish within ([\d.]+) s", record["error_message"])
    assert within and float(within.group(1)) <= 45 - 15, record["error_message"]
    # where it was (generate, or load on a busy host)
    assert "rank 1: during " in record["error_message"]
    # its stack
    assert (
        "--- rank 1 stderr ---" in record["rank_log_tail"] and 'File "' in record["rank_log_tail"]
    )


def test_importable_without_torch():
    import subprocess

    code = "import sys, model_support.probe.sharded; sys.exit('torch' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_each_cpu_rank_gets_its_share_of_the_probes_threads():
    """A sweep sets each probe's OMP_NUM_THREADS (its share of the cores); the probe's ranks
    split it, as they split every core when nothing is set."""
    from model_support.probe.sharded.launch import rank_threads

    cores = os.cpu_count() or 1
    assert (
        rank_threads(2, {"OMP_NUM_THREADS": "4"}),
        rank_threads(4, {"OMP_NUM_THREADS": "4"}),
    ) == (2, 1)
    assert rank_threads(2, {"OMP_NUM_THREADS": "1"}) == 1  # never none
    assert rank_threads(2, {}) == rank_threads(2, {"OMP_NUM_THREADS": "4,2"}) == max(1, cores // 2)


def test_the_papermill_probe_with_devices_2_is_tensor_parallel_and_agrees_in_float32(tmp_path):
    """The headline command with -p devices 2: one rank per (pretend) device, the model's TP
    plan, the same greedy tokens as the one-device float32 run; each record says the CPU threads
    its model ran with (the probe's 2, split between the 2 ranks)."""
    import json
    import subprocess

    papermill = os.path.join(os.path.dirname(sys.executable), "papermill")
    records = {}
    for devices in ("1", "2"):
        path = tmp_path / f"r{devices}.json"
        run = subprocess.run(
            [
                papermill,
                "notebooks/probe.ipynb",
                str(tmp_path / f"o{devices}.ipynb"),
                "-p",
                "model_id",
                "data/models/tiny-llama",
                "-p",
                "device",
                "cpu",
                "-p",
                "dtype",
                "float32",
                "-p",
                "reference",
                "none",
                "-p",
                "devices",
                devices,
                "-p",
                "record_path",
                str(path),
            ],
            cwd=checkout_root(),
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "2"},
        )
        assert run.returncode == 0, run.stderr[-3000:]
        records[devices] = json.loads(path.read_text())
    one, two = records["1"], records["2"]
    assert (two["status"], two["devices_used"], two["parallelism"], two["tp_size"]) == (
        "PASS",
        2,
        "tp",
        2,
    )
    assert (one["devices_used"], one["parallelism"]) == (1, "none")
    assert two["output_token_ids"] == one["output_token_ids"] and len(two["load_s_per_rank"]) == 2
    assert two["ranks_agree"] is True and two["rank_errors"] is None
    assert (one["cpu_threads"], two["cpu_threads"]) == (2, 1)


def test_a_sweep_hands_out_devices_not_slots_and_resumes(tmp_path):
    """1- and 2-device models on a pretend 2-device CPU host (2 workers): every model right,
    never more ranks than devices at once (from the recorded grants), nothing lost or doubled
    after a SIGKILL."""
    import json
    import signal
    import subprocess

    import yaml

    from model_support.record import store

    root = checkout_root()
    auto = {"devices": "auto", "device_memory_gb": 0.001}
    models = [
        {"id": "data/models/sharded-llama", "overrides": auto},
        "data/models/tiny-gpt2",
        {"id": "data/models/sharded-mixtral", "overrides": auto},
        "data/models/tiny-llama",
        "data/models/tiny-opt",
    ]
    definition = tmp_path / "mixed.yaml"
    definition.write_text(
        yaml.safe_dump(
            {"name": "mixed", "probe": {"device": "cpu", "reference": "none"}, "models": models}
        )
    )
    data = tmp_path / "data"
    cli = [sys.executable, "-m", "model_support.cli", "sweep"]
    runner = subprocess.Popen(
        [*cli, str(definition), "--data-dir", str(data), "--workers", "2", "--no-report"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 600
    while time.time() < deadline and len(list(data.glob("sweeps/*/records/*.json"))) < 2:
        time.sleep(0.05)
    runner.send_signal(signal.SIGKILL)
    runner.wait()
    sweep_id = next((data / "sweeps").iterdir()).name
    resumed = subprocess.run(
        [*cli, "--resume", sweep_id, "--data-dir", str(data), "--workers", "2", "--no-report"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = store.scan(data).collect()
    assert sorted(rows["model_id"]) == sorted(
        [
            "local:sharded-llama",
            "local:tiny-gpt2",
            "local:sharded-mixtral",
            "local:tiny-llama",
            "local:tiny-opt",
        ]
    )
    assert set(rows["status"]) == {"PASS"}
    used = dict(rows.select("model_id", "devices_used").iter_rows())
    assert (
        used["local:sharded-llama"] == used["local:sharded-mixtral"] == 2
        and used["local:tiny-opt"] == 1
    )
    grants = [
        json.loads(line)
        for line in (data / "sweeps" / sweep_id / "schedule.jsonl").read_text().splitlines()
    ]
    assert {tuple(g["devices"]) for g in grants if g["model_id"] == "local:sharded-llama"} == {
        (0, 1)
    }
    for i, a in enumerate(grants):  # no device held by two probes at once
        for b in grants[i + 1 :]:
            overlap = a["start"] < b["end"] and b["start"] < a["end"]
            assert not (overlap and set(a["devices"]) & set(b["devices"])), (a, b)


def test_a_model_needing_more_devices_than_the_sweep_has_is_refused(tmp_path):
    import subprocess

    import yaml

    definition = tmp_path / "big.yaml"
    definition.write_text(
        yaml.safe_dump(
            {
                "name": "big",
                "probe": {"device": "cpu", "devices": 4},
                "models": ["data/models/tiny-llama"],
            }
        )
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "sweep",
            str(definition),
            "--data-dir",
            str(tmp_path / "data"),
            "--workers",
            "2",
            "--no-report",
        ],
        cwd=checkout_root(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "Error: local:tiny-llama needs 4 devices and the sweep has 2; run it with --workers 4 "
        "or more (one per device)."
    )


def test_ray_asks_for_each_models_devices_and_gives_the_same_rows(tmp_path):
    """The same mixed sweep on a local Ray: a 2-device probe asks for 2 CPUs (its ranks), the
    others 1; the Ray the sweep starts listens on the loopback address only."""
    pytest.importorskip("ray")
    from model_support.record import store
    from model_support.sweep import definition as params
    from model_support.sweep import runner as sweep
    from model_support.sweep.executors import devices_needed
    from model_support.sweep.executors.ray import ray_resources

    auto = {"devices": "auto", "device_memory_gb": 0.001}
    raw = {
        "name": "ray-mixed",
        "probe": {"device": "cpu", "reference": "none"},
        "models": [{"id": "data/models/sharded-llama", "overrides": auto}, "data/models/tiny-gpt2"],
    }
    definition = params.parse(raw, source="ray.yaml", base=checkout_root())
    listens: list = []

    def where_ray_listens(record, done, total):  # while the local Ray the sweep started runs
        import ray

        listens.append(
            ({n["NodeManagerAddress"] for n in ray.nodes()}, ray.get_runtime_context().gcs_address)
        )

    summary = sweep.run(
        definition, tmp_path / "data", workers=2, executor="ray", on_result=where_ray_listens
    )
    rows = store.scan(tmp_path / "data").collect()
    assert summary["executor"] == "ray" and set(rows["status"]) == {"PASS"}
    # a local Ray is this host's alone: its node and its GCS on the loopback address, not the host's
    # network one
    assert listens and all(
        nodes == {"127.0.0.1"} and gcs.startswith("127.0.0.1:") for nodes, gcs in listens
    )
    assert dict(rows.select("model_id", "devices_used").iter_rows()) == {
        "local:sharded-llama": 2,
        "local:tiny-gpt2": 1,
    }
    tasks = sweep.build_tasks(store.read_sweep(tmp_path / "data", summary["sweep_id"]))
    assert [ray_resources("cpu", devices_needed(t, 2)) for t in tasks] == [
        {"num_cpus": 2},
        {"num_cpus": 1},
    ]
    assert ray_resources("tpu", 4) == {"num_cpus": 1, "resources": {"TPU": 4}}


def test_ray_holds_the_clusters_devices_and_refuses_others_before_the_sweep_is_written(tmp_path):
    """Ray pins a task to GPUs and TPU chips only: "auto" becomes the cluster's accelerator (so
    each probe reserves one), and any other device is refused in one sentence before anything is
    written."""
    from model_support.errors import UserError
    from model_support.sweep import definition as params
    from model_support.sweep import runner as sweep
    from model_support.sweep.executors.ray import ray_auto_device, ray_resources

    assert ray_auto_device({"CPU": 16.0, "GPU": 2.0}) == "cuda"
    assert ray_auto_device({"CPU": 8.0, "TPU": 4.0}) == "tpu"
    assert ray_auto_device({"CPU": 2.0}) == "cpu"
    # the cuda adapter's Ray resource
    assert ray_resources("cuda", 2) == {"num_cpus": 1, "num_gpus": 2}
    raw = {"name": "ray-xpu", "probe": {"device": "xpu"}, "models": ["data/models/tiny-gpt2"]}
    definition = params.parse(raw, source="ray.yaml", base=checkout_root())
    with pytest.raises(
        UserError, match=r"not for 'xpu' devices: run this sweep with --executor local"
    ):
        sweep.run(definition, tmp_path / "data", executor="ray")
    assert not (tmp_path / "data" / "sweeps").exists()


def test_ranks_import_the_package_from_where_the_probe_did(tmp_path):
    """The ranks' PYTHONPATH starts with the folder the probe's ``model_support`` came from
    (``src`` in a checkout), so a rank runs this code, not another install's."""
    import model_support
    from model_support.probe.sharded import launch

    first = launch._child_env("cpu", 2)["PYTHONPATH"].split(os.pathsep)[0]
    env = {**os.environ, "PYTHONPATH": first}
    code = "import model_support; print(model_support.__file__)"
    child = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert child.stdout.strip() == model_support.__file__, child.stderr[-500:]
