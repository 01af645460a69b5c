"""The probe's instruments at a few per cent of a probe or off by default (issue 47, part 2;
bench/bench_instruments.py measures them): the sampled census (it counts the decode steps until
two in a row are alike, then steps off torch's dispatch stack and extrapolates the rest) records
what a full census does; the flight recorder is armed only in a probe's own run
(``flight_recorder`` auto) and a silent abort is rerun under it; each can be switched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from model_support.probe import census, census_mode
from model_support.probe.instruments import flight_recorder, host_cost

#: Text fixtures whose every decode step dispatches the same operators (attention, norms and caches
#: of several kinds: llama's RMSNorm, GPT-2's learned positions, Gemma 3's sliding-window layers,
#: OPT, Phi-3's fused qkv).
FIXTURES = ["tiny-llama", "tiny-gpt2", "tiny-gemma3", "tiny-opt", "tiny-phi3"]

#: Each fixture's census, full and sampled, from the probe's stages as run.py holds them (on
#: ``sys.argv[1]``).
BOTH = """
    import json, sys
    from model_support.probe import census, census_mode, devices, probe_core, probe_params, run

    device, models = sys.argv[1], sys.argv[2:]
    devices.prepare_environment(device)
    adapter = devices.resolve(device)
    settings = {**run.DEFAULTS, "device": device}
    sync = adapter.synchronize if device != "cpu" else None
    out = {}
    for model in models:
        for kind in ("full", "sampled"):
            counted = census_mode.Census(adapter.type, adapter.synchronous_ops)
            timer = probe_core.StepTimer(sync)
            if kind == "sampled":
                timer = counted.following(timer, settings["max_new_tokens"])
            with counted:
                result = probe_core.run_stages(
                    model_id=f"data/models/{model}", **probe_params.stage_settings(settings), device=adapter.torch_device,
                    synchronize=sync, timer=timer, on_stage=counted.enter,
                )
            out[f"{model} {kind}"] = {
                "status": result["status"], "tokens_out": result["tokens_out"], **counted.fields("run"),
                "extrapolated": counted.extrapolated, "note": counted.times()["ops_time_source"],
                "seconds": len(counted.times()["ops_sig_device_s"] or []),
            }
    print(json.dumps(out))
"""


def _both(device: str, models: list[str]) -> dict:
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": "{}"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(BOTH), device, *models],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("device", "models"), [("cpu", FIXTURES), ("pretend", ["tiny-llama", "tiny-gpt2"])]
)
def test_a_sampled_census_records_what_a_full_one_does(device, models):
    """8 new tokens: the census counts the prefill and decode steps 1 and 2 (alike), steps off
    for steps 3 to 6, back on for the 7th and what follows (each step's logits read back): the
    operators, their stages, signatures, ranks and calls are the full census's, exactly, and its
    ``ops_time_source`` says the later steps were extrapolated."""
    found = _both(device, models)
    for model in models:
        full, sampled = found[f"{model} full"], found[f"{model} sampled"]
        assert (full["status"], sampled["status"], sampled["tokens_out"]) == ("PASS", "PASS", 8), (
            model
        )
        for field in census.FIELDS:
            assert sampled[field] == full[field], (model, field)
        assert sampled["extrapolated"] == 5 and full["extrapolated"] == 0, model
        assert (
            sampled["note"].endswith(census.EXTRAPOLATED)
            and census.EXTRAPOLATED not in full["note"]
        ), model
        assert sampled["seconds"] == len(sampled["ops_sig_ops"]), model


def test_a_generation_that_stops_early_keeps_its_operators_and_misses_one_stop_check():
    """tiny-eos-early ends at its end-of-sequence token (3 tokens) right after the census stepped
    off: nothing was left to extrapolate, the operators and signatures are the full census's, and
    only the last step's stop check (read after its token was streamed) is one call short, as
    ``EXTRAPOLATED`` says."""
    found = _both("cpu", ["tiny-eos-early"])
    full, sampled = found["tiny-eos-early full"], found["tiny-eos-early sampled"]
    assert sampled["tokens_out"] == 3 and sampled["extrapolated"] == 0
    assert sampled["ops"] == full["ops"] and sampled["ops_sig_dtypes"] == full["ops_sig_dtypes"]
    short = {
        op: f - s
        for op, f, s in zip(full["ops"], full["ops_calls"], sampled["ops_calls"])
        if f != s
    }
    assert short == {"aten::max": 1, "aten::eq.Scalar": 1, "aten::_local_scalar_dense": 1}
    assert sampled["note"].endswith(census.EXTRAPOLATED)


class _Streamer:
    """A stand-in for the probe's step timer."""

    def __init__(self):
        self.times, self.ended = [], False

    def put(self, value):
        self.times.append(value)

    def end(self):
        self.ended = True


def _generate(timer, steps: list[list[str]], x):
    """A generation: the prompt streamed, then per step its operators (``neg``, ``relu``,
    ``exp``) and its token."""
    timer.put("prompt")
    for ops in steps:
        for op in ops:
            x = getattr(x, op)()
        timer.put("token")
    x.sum()  # after the generation: the logits read back
    timer.end()


def test_the_census_steps_off_only_once_two_decode_steps_are_alike_and_adds_the_rest():
    """The prefill, then a first decode step unlike the second: the census counts on until the
    second and third are alike, steps off (nothing reaches it: it is off torch's stack), steps on
    for the last token, adds the skipped steps as copies of the last counted one, and counts what
    follows the generation; the streamer it wraps gets every token and its end."""
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    steps = [
        ["neg", "neg"],
        ["neg", "relu"],
        ["neg", "exp"],
        ["neg", "exp"],
        ["neg", "exp"],
        ["neg", "exp"],
    ]
    steps.append(["neg", "exp"])
    counted, inner = census_mode.Census("cpu"), _Streamer()
    timer = counted.following(inner, max_new_tokens=len(steps))
    off = []
    real_put = counted.token

    def token():
        real_put()
        off.append(_get_current_dispatch_mode() is not counted)

    counted.token = token
    x = torch.ones(3)
    with torch.inference_mode(), counted:
        counted.enter("generate")
        _generate(timer, steps, x)
    fields = counted.fields("run")
    calls = dict(zip(fields["ops"], fields["ops_calls"]))
    # as a full census counts
    assert calls == {"aten::neg": 8, "aten::relu": 1, "aten::exp": 5, "aten::sum": 1}
    # tokens: the prompt, the prefill's, decode steps 1, 2 (unlike 1), 3 (alike 2: off), 4, 5 (off),
    # 6 (the last: on)
    assert off == [False, False, False, False, True, True, True, False]
    assert (
        counted.extrapolated == 3
        and inner.times == ["prompt"] + ["token"] * len(steps)
        and inner.ended
    )
    assert timer.times is inner.times  # the streamer's own, read through


def test_a_census_under_another_mode_does_not_step_off():
    """A dispatch mode pushed above the census (one the census cannot come off from under): it
    counts every step."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Above(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    steps = [["neg"]] * 6
    counted = census_mode.Census("cpu")
    timer = counted.following(_Streamer(), max_new_tokens=len(steps))
    x = torch.ones(3)
    with torch.inference_mode(), counted:
        counted.enter("generate")
        with Above():
            _generate(timer, steps, x)
    assert counted.extrapolated == 0 and not counted.stepped
    assert dict(zip(*(counted.fields("run")[f] for f in ("ops", "ops_calls")))) == {
        "aten::neg": 6,
        "aten::sum": 1,
    }


#: tiny-llama probed on the pretend device, each instrument switched: the record's census and
#: host-cost fields.
SWITCHED = """
    import json, sys
    from model_support.probe import run
    out = {}
    for switches in ({}, {"census": "full"}, {"census": "off", "host_cost": "off"}):
        record = run.run_probe(
            "data/models/tiny-llama", device="pretend", reference="none", judge=False, perf=False, **switches
        )
        out[json.dumps(switches)] = {
            k: record[k] for k in ("status", "ops", "ops_calls", "ops_time_source", "ops_missing", "host_cost_note")
        }
    print(json.dumps(out))
"""


def test_each_instrument_is_switched_by_its_probe_setting():
    """``census`` sampled (the default) and full give the same census, the sampled one saying so;
    off gives none (null ``ops`` and coverage, ``ops_time_source`` why); ``host_cost`` off counts
    nothing, saying why."""
    env = {**os.environ, "MODEL_SUPPORT_PRETEND": "{}"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SWITCHED)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    sampled, full, off = (
        found["{}"],
        found['{"census": "full"}'],
        found['{"census": "off", "host_cost": "off"}'],
    )
    assert sampled["status"] == full["status"] == off["status"] == "PASS"
    assert (sampled["ops"], sampled["ops_calls"]) == (full["ops"], full["ops_calls"]) and sampled[
        "ops_missing"
    ] == []
    assert (
        sampled["ops_time_source"].endswith(census.EXTRAPOLATED)
        and census.EXTRAPOLATED not in full["ops_time_source"]
    )
    assert (off["ops"], off["ops_missing"], off["ops_time_source"]) == (
        None,
        None,
        "not measured: census=off",
    )
    assert sampled["host_cost_note"].startswith("counted by the pretend backend")
    assert off["host_cost_note"] == "not measured: host_cost=off"


# --------------------------------------------------------------------------------------------
# the flight recorder: armed only by default, a silent abort rerun under it


class _Adapter:
    type = "pretend"
    blocking_env = {"X_BLOCKING": "1"}


@pytest.mark.parametrize("switch", ["auto", "on", "off"])
def test_the_recorder_records_a_probes_own_run_only_when_switched_on(tmp_path, monkeypatch, switch):
    """auto (the default) and off write the file with its meta, for the runner, and put no mode
    on torch's stack: nothing is recorded; on records the run; a crash's rerun records whatever
    the setting."""
    import torch

    monkeypatch.setenv(flight_recorder.FLIGHT_VAR, str(tmp_path / flight_recorder.FLIGHT_FILE))
    settings = {"mode": "eager", "flight_recorder": switch}
    assert flight_recorder.recorder_for(settings, _Adapter(), mode_sees=False) is None
    with flight_recorder.recorder_for(settings, _Adapter(), mode_sees=True) as recorder:
        recorder.enter("generate")
        torch.ones(2, device="cpu").neg()  # the recorder's device is not the CPU's: never recorded
    found = flight_recorder.read(tmp_path / flight_recorder.FLIGHT_FILE)
    meta = {
        "blocking_env": {"X_BLOCKING": "1"},
        "mode": "eager",
        "recording": switch,
        "device": "pretend",
    }
    assert found["meta"] == meta
    assert found["recorded"] == 0
    rerun = flight_recorder.recorder_for(settings, _Adapter(), mode_sees=True, rerun=True)
    assert rerun.recording and rerun.meta["recording"] == "on"
    assert flight_recorder.recorder_for(settings, _Adapter(), mode_sees=True).recording == (
        switch == "on"
    )


def _armed(tmp_path, switch: str, blocking: dict | None = None) -> None:
    """A probe's recorder file, armed with ``switch``, as the probe left it."""
    meta = {
        "blocking_env": {"X_BLOCKING": "1"} if blocking is None else blocking,
        "recording": switch,
    }
    with flight_recorder.FlightRecorder(
        tmp_path / flight_recorder.FLIGHT_FILE, "cpu", meta, recording=switch == "on"
    ):
        pass


@pytest.mark.parametrize(
    ("switch", "blocking", "said", "rerun_env"),
    [
        ("auto", None, None, {"X_BLOCKING": "1"}),  # silent: rerun synchronously under the recorder
        # no synchronous switch: rerun all the same, only the rerun can name it
        ("auto", {}, None, {}),
        # the runtime named it
        ("auto", None, "pretend runtime: fatal error in aten::relu; aborting", None),
        ("on", None, None, {"X_BLOCKING": "1"}),  # as before: the late report's synchronous rerun
        ("on", {}, None, None),  # recorded, and nothing would make a rerun more exact
        ("off", None, None, None),
    ],
)
def test_a_silent_abort_is_rerun_under_the_recorder_as_its_setting_says(
    tmp_path, monkeypatch, switch, blocking, said, rerun_env
):
    import signal

    _armed(tmp_path, switch, blocking)
    started = tmp_path / "record.json.started"
    started.write_text("{}")
    ran = []

    def run(argv, env, **kwargs):
        ran.append({k: env.get(k) for k in ("X_BLOCKING", flight_recorder.FLIGHT_VAR)})
        return subprocess.CompletedProcess(argv, -signal.SIGABRT)

    monkeypatch.setattr(flight_recorder.subprocess, "run", run)
    monkeypatch.delenv("X_BLOCKING", raising=False)
    flight_recorder.rerun_silent_crash(tmp_path, started, -signal.SIGABRT, said, 60.0)
    if rerun_env is None:
        assert ran == [] and not (tmp_path / f"{flight_recorder.RERUN_FILE}.json").exists()
        return
    assert ran == [
        {
            "X_BLOCKING": rerun_env.get("X_BLOCKING"),
            flight_recorder.FLIGHT_VAR: str(tmp_path / "flight-blocking.bin"),
        }
    ]
    outcome = json.loads((tmp_path / f"{flight_recorder.RERUN_FILE}.json").read_text())
    assert outcome["exit"] == -signal.SIGABRT and outcome["blocking_env"] == rerun_env


def _rerun(work, exit_status: int, blocking: dict) -> dict:
    """The runner's crash fields once a rerun under the recorder (its last operator ``aten::exp``
    of a float32[2]) ended with ``exit_status``, run with ``blocking``."""
    import torch

    with flight_recorder.FlightRecorder(work / flight_recorder.RERUN_FILE, "cpu"):
        torch.ones(2).exp()
    (work / f"{flight_recorder.RERUN_FILE}.json").write_text(
        json.dumps({"exit": exit_status, "blocking_env": blocking})
    )
    return flight_recorder.crash_fields(work, died=True)


def test_a_dead_kernels_row_says_how_its_operator_was_found_with_the_recorder_armed_only(tmp_path):
    """auto: the rerun's last operator (synchronous or not, said), or why none: no rerun ran, or
    it did not die; off: not measured, saying so."""
    _armed(tmp_path, "auto")
    assert flight_recorder.crash_fields(tmp_path, died=True) == {
        "crash_operator_note": flight_recorder.NOT_RERUN
    }
    # OOM killer
    killed = flight_recorder.crash_fields(tmp_path, died=True, kernel_exit=-9)[
        "crash_operator_note"
    ]
    assert killed.startswith(
        "not measured: the kernel was killed by SIGKILL (what the kernel's OOM killer sends"
    )
    assert "not aborted by its runtime, so it was not rerun" in killed
    # an abort no rerun came back from
    aborted = flight_recorder.crash_fields(tmp_path, died=True, kernel_exit=-6)
    assert aborted == {"crash_operator_note": flight_recorder.NOT_RERUN}
    found = _rerun(tmp_path, -6, {"X_BLOCKING": "1"})
    assert (found["crash_operator"], found["crash_operator_args"]) == ("aten::exp", "float32[2]")
    assert found["crash_operator_note"].startswith(
        "the operator a synchronous rerun (X_BLOCKING=1) died in, under"
    )
    assert "no synchronous switch" in _rerun(tmp_path, -6, {})["crash_operator_note"]
    found = _rerun(tmp_path, 0, {"X_BLOCKING": "1"})
    assert (
        "crash_operator" not in found
        and "ended with exit status 0 without dying" in found["crash_operator_note"]
    )
    _armed(tmp_path, "off")
    assert flight_recorder.crash_fields(tmp_path, died=True) == {
        "crash_operator_note": "not measured: flight_recorder=off"
    }
    assert flight_recorder.crash_fields(tmp_path, died=False) == {}


def test_host_cost_off_counts_nothing():
    from model_support.probe.devices import AcceleratorAdapter

    assert host_cost.meter_for(AcceleratorAdapter("xpu"), "eager", "off") == (None, "host_cost=off")
