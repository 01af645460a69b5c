"""The prepared device check (``bench/device_check.sh``): what only a machine with a CUDA GPU can say.

Nothing is downloaded: the tiny fixtures are built here (``fixtures.build``, offline) and the real-size
models are random weights from real configs (Llama-3-8B and Llama-3.2-1B, bf16) with a fixture's
tokenizer. Each step is timed and guarded (a step that fails is recorded with its error and the next
runs); the whole stays within ``--budget-s`` (a step that would start past it is skipped, and says so).

1. a papermill probe on ``cuda`` (tiny-llama): verdict, peak device memory from the allocator, and the perf
   phase (TTFT, TPOT with their spread, tokens/s, bandwidth utilisation against the GPU's declared peak);
2. compile mode (inductor) on the same model: compile time, graphs, matches eager;
3. the fixtures' sweep with 1 worker, then with 4 sharing the GPU: wall, verdicts, held-idle share and
   utilisation (``sweep.device_time``);
4. the real-size models: load (from disk to the GPU) and generation time, the allocator's peak; Llama-3.2-1B's
   perf phase (its TPOT and model bandwidth utilisation: the first real MBU figure);
5. the numerics check's false-suspect rate: healthy GPU bf16 kernels against the CPU float32 reference
   (``diverges`` among the PASSes of every run above, and Llama-3.2-1B's).

``--dry-run`` runs every step on one pretend device with small sizes (a 2-layer "8B"; 2 workers sharing the
device, as 4 share the GPU): what ``make test`` runs, so the script never rots. Results: ``<out>/device_check.json`` (and the bench README's
table when ``<out>`` is bench/results).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))  # the offline fixture builders
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FIXTURES = ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-mistral"]
#: Real configs (transformers' LlamaConfig keywords); the dry run shrinks them.
REAL = {
    "llama-3-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
    ),
    "llama-3.2-1b": dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
}  # fmt: skip
#: The perf phase's figures a probe records (issue 37: how fast, with the spread over repeats;
#: bandwidth use).
PERF_KEYS = (
    "ttft_s", "ttft_spread", "tpot_s", "tpot_spread", "perf_tokens_per_s", "perf_first_call_s",
    "perf_peak_device_mem_mb", "decode_bytes_per_token", "bandwidth_utilisation", "perf_note", "ops_time_source",
)  # fmt: skip
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


class Check:
    """The results, step by step, within a time budget."""

    def __init__(self, budget_s: float):
        self.started, self.budget_s = time.time(), budget_s
        self.steps: dict[str, dict] = {}

    def step(self, name: str, estimate_s: float, fn, *args, **kwargs) -> dict | None:
        left = self.budget_s - (time.time() - self.started)
        if left < estimate_s:
            self.steps[name] = {
                "skipped": f"{left:.0f} s of the budget left, the step needs about {estimate_s:.0f} s"
            }
            return None
        began = time.time()
        print(f"== {name}", flush=True)
        try:
            result = fn(*args, **kwargs)
            self.steps[name] = {**result, "wall_s": round(time.time() - began, 2)}
        except Exception as exc:  # noqa: BLE001 a failed step is a result; the next step still runs
            self.steps[name] = {
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-2000:],
            }
        print(json.dumps(self.steps[name], default=str)[:600], flush=True)
        return self.steps[name]


def env(device: str) -> dict:
    # one device, as on a machine with one GPU: the shared sweep's workers are more than the devices
    extra = (
        {"MODEL_SUPPORT_PRETEND": json.dumps({"devices": 1, "bandwidth_gbs": 10})}
        if device == "pretend"
        else {}
    )
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}:{REPO / 'pretend' / 'src'}:{os.environ.get('PYTHONPATH', '')}",
        **extra,
    }


def papermill_probe(scratch: Path, device: str, model: str, dry: bool, **params) -> dict:
    """`papermill notebooks/probe.ipynb out.ipynb -p model_id X -p device D`, as a user types it."""
    out, record_path = (
        scratch / f"probe-{params.get('mode', 'eager')}.ipynb",
        scratch / "record.json",
    )
    command = [
        sys.executable,
        "-m",
        "papermill",
        "notebooks/probe.ipynb",
        str(out),
        "-p",
        "model_id",
        model,
    ]
    params = {
        "device": device,
        "record_path": str(record_path),
        "judge": False,
        **_short(dry),
        **_perf(dry),
        **params,
    }
    for key, value in params.items():
        command += ["-p", key, str(value)]
    done = subprocess.run(
        command, cwd=REPO, env=env(device), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    record = json.loads(record_path.read_text())
    keys = (
        "status", "device_type", "device_name", "load_s", "first_token_s", "generate_s", "decode_tokens_per_s",
        "peak_device_mem_mb", "device_mem_source", "numerics", "compile_backend", "compile_s", "graphs",
        "graph_breaks", "matches_eager", "error_message", *PERF_KEYS,
        # issue 38's, first read on a GPU here: recompiles across prompt lengths, the compiled run's
        # profiler
        "recompile_lengths", "recompiles_static", "recompiles_dynamic", "recompile_flag", "recompile_note",
        "profiled_ops", "profiled_ops_s", "host_syncs_per_token", "host_cost_note",
    )  # fmt: skip
    return {k: record.get(k) for k in keys}


def sweep(scratch: Path, device: str, models: list[str], workers: int, dry: bool) -> dict:
    data = scratch / f"sweep-{workers}"
    shutil.rmtree(data, ignore_errors=True)  # a scratch folder used before
    definition = scratch / f"sweep-{workers}.yaml"
    probe = {"device": device, "judge": False, **_short(dry), **_perf(dry)}
    definition.write_text(
        json.dumps(
            {"name": f"check-{workers}", "probe": probe, "workers": workers, "models": models}
        )
    )
    command = [
        sys.executable,
        "-m",
        "model_support.cli",
        "sweep",
        str(definition),
        "--data-dir",
        str(data),
    ]
    done = subprocess.run(
        [*command, "--no-report"],
        cwd=REPO,
        env=env(device),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-1500:])
    (folder,) = (data / "sweeps").iterdir()
    records = [json.loads(p.read_text()) for p in (folder / "records").glob("*.json")]
    meta = json.loads((folder / "sweep.json").read_text())
    return {
        "verdicts": {r["model_id"]: r["status"] for r in records},
        "numerics": {r["model_id"]: r.get("numerics") for r in records},
        "devices_seen": sorted({str(r.get("device_count")) for r in records}),
        "device_time": meta.get("device_time"),
    }


def build_random(scratch: Path, name: str, dry: bool, tokenizer_from: str) -> Path:
    """A random-weight model of a real config in bf16, saved as safetensors with a fixture's
    tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = scratch / name
    if (folder / "config.json").exists():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    shape = {**REAL[name], **(SMALL if dry else {})}
    config = LlamaConfig(
        **shape, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, architectures=["LlamaForCausalLM"],
    )  # fmt: skip
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(folder, max_shard_size="4GB")
    tokenizer.save_pretrained(folder)
    return folder


def real_size(scratch: Path, device: str, dry: bool, tokenizer_from: str) -> dict:
    """Load (disk to device) and generation of each real-size model, the allocator's peak; and
    Llama-3.2-1B's numerics against the CPU float32 reference (the probe's own path)."""
    import torch

    from model_support.probe import devices, probe_core
    from model_support.probe.run import run_probe

    if dry:
        os.environ.update({k: v for k, v in env(device).items() if k == "MODEL_SUPPORT_PRETEND"})
    adapter = devices.resolve(device)
    found: dict = {}
    for name in REAL:
        built = time.time()
        folder = build_random(scratch, name, dry, tokenizer_from)
        adapter.reset_peak_memory()
        result = probe_core.run_stages(
            model_id=str(folder),
            dtype="bfloat16",
            device=adapter.torch_device,
            synchronize=adapter.synchronize,
            **_short(dry),
        )
        peak, source = adapter.peak_memory_mb()
        found[name] = {
            "build_s": round(time.time() - built, 1),
            "num_params": result["num_params"],
            "status": result["status"],
            "error": repr(result["exception"]) if result["exception"] is not None else None,
            "load_s": result["load_s"],
            "first_token_s": result["first_token_s"],
            "generate_s": result["generate_s"],
            "decode_tokens_per_s": result["decode_tokens_per_s"],
            "peak_device_mem_mb": peak,
            "device_mem_source": source,
        }
        del result
        if device == "cuda":
            torch.cuda.empty_cache()
    record = run_probe(
        str(scratch / "llama-3.2-1b"), device=device, judge=False, **_short(dry), **_perf(dry)
    )
    found["llama-3.2-1b"]["numerics"] = record["numerics"]
    found["llama-3.2-1b"]["numerics_note"] = record["numerics_note"]
    # TTFT, TPOT, MBU of a real-size model
    found["llama-3.2-1b"]["perf"] = {k: record[k] for k in PERF_KEYS}
    return found


def _short(dry: bool) -> dict:
    """The dry run's probes generate 2 tokens (the pretend device dispatches every operator in
    Python)."""
    return {"max_new_tokens": 2} if dry else {}


def _perf(dry: bool) -> dict:
    """The dry run's perf phase: 2 repeats of 4 tokens (a GPU's: the defaults)."""
    return {"perf_tokens": 4, "perf_repeats": 2} if dry else {}


def false_suspects(steps: dict) -> dict:
    """Healthy kernels: every PASS whose numerics say ``diverges`` is a false suspect."""
    seen: list[tuple[str, str | None]] = []
    for name in ("sweep_1_worker", "sweep_shared"):
        for model, numerics in (steps.get(name, {}).get("numerics") or {}).items():
            if steps[name]["verdicts"].get(model) == "PASS":
                seen.append((f"{name}:{model}", numerics))
    for name in ("probe_eager", "probe_compile"):
        if steps.get(name, {}).get("status") == "PASS":
            seen.append((name, steps[name].get("numerics")))
    numerics_1b = steps.get("real_size", {}).get("llama-3.2-1b", {}).get("numerics")
    if numerics_1b:
        seen.append(("llama-3.2-1b", numerics_1b))
    checked = [(k, v) for k, v in seen if v is not None]
    diverges = [k for k, v in checked if v == "diverges"]
    return {
        "checked": len(checked),
        "diverges": diverges,
        "rate": round(len(diverges) / len(checked), 3) if checked else None,
        "by_kind": {v: sum(1 for _, x in checked if x == v) for v in ("match", "ties", "diverges")},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="the pretend device, small sizes (make test)"
    )
    parser.add_argument(
        "--out", type=Path, default=HERE / "results", help="where device_check.json goes"
    )
    parser.add_argument(
        "--budget-s", type=float, default=450.0, help="stop starting steps past this"
    )
    args = parser.parse_args()
    dry = args.dry_run
    device = "pretend" if dry else "cuda"
    scratch = Path(
        os.environ.get("DEVICE_CHECK_SCRATCH") or tempfile.mkdtemp(prefix="device-check-")
    ).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    check = Check(args.budget_s)
    from fixtures.build import build_fixtures

    # built offline where missing (the GPU machine), cached here
    models_dir = REPO / "data" / "models"
    names = FIXTURES[:2] if dry else FIXTURES
    built = check.step(
        "fixtures",
        5,
        lambda: {
            "built": sorted(set(build_fixtures(models_dir, names=names)["fixtures"]) & set(names))
        },
    )
    paths = [str(models_dir / name) for name in names]
    if built and "error" not in built:
        check.step("probe_eager", 20, papermill_probe, scratch, device, paths[0], dry)
        # the dry run leaves out the compile probe's recompile check (three more prompt lengths, ~11
        # s on the pretend device; tests/test_recompiles.py runs it): on the GPU it runs, and its
        # lengths are recorded
        recompiles = {"recompile_check": False} if dry else {}
        check.step(
            "probe_compile",
            30,
            papermill_probe,
            scratch,
            device,
            paths[0],
            dry,
            mode="compile",
            **recompiles,
        )
        check.step("sweep_1_worker", 40, sweep, scratch, device, paths, 1, dry)
        check.step("sweep_shared", 40, sweep, scratch, device, paths, 2 if dry else 4, dry)
        check.step("real_size", 30 if dry else 150, real_size, scratch, device, dry, paths[0])
    check.steps["false_suspects"] = false_suspects(check.steps)
    results = {
        "dry_run": dry,
        "device": device,
        "gpu": _gpu(device),
        "steps": check.steps,
        "wall_s": round(time.time() - check.started, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_check.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"wrote {args.out / 'device_check.json'} in {results['wall_s']} s")
    if args.out.resolve() == (HERE / "results").resolve():
        subprocess.run(
            [sys.executable, str(HERE / "run_all.py"), "--tables"], check=False, cwd=REPO
        )
    failed = [name for name, step in check.steps.items() if "error" in step]
    return 1 if failed else 0


def _gpu(device: str) -> str | None:
    if device != "cuda":
        return None
    done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
