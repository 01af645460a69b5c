"""What the long-text check costs the device, against the probe's own device time, and how far noise moves its rate.

Issue 56's rule for a new check of the device (the perf phase's: the device pays for what the answers need): its
default comes from its cost. Per device (the CPU and the pretend accelerator, the two this machine has), in one
child process each (the pretend device is registered per process):

1. the probe as a sweep runs it (``run.run_probe``, its defaults: the perf phase on for an accelerator, off on the
   CPU; the reference and the judge off, host checks that cost the device nothing), twice; its device seconds are the
   device phase's (``phases.device_phase``: the weights' move, the verdict's generation, the perf phase);
2. the long text's device half (``long_text.run_paths``: one prefill over the text, then one decode step per
   position through the KV cache) on the same model kept from the stages, at each length asked;
3. its rates against the CPU reference (float32, teacher-forced; computed once, then read from the data folder's
   cache, both timed).

A last child runs the long text on the pretend device with bf16-sized noise (``wrong_ops``: every matrix product
off by 0.39%, half of bf16's epsilon, with a random sign) to say how far a healthy stack's rounding moves the rate
the gate reads (``expectations.LONG_TEXT_TOLERANCE`` must sit above it). Every child also runs the prefill alone over
``--tokens`` (one forward pass: cheap on any device) and scores it by 128-position windows, so the noise is read over
the default length even where the decode path is run shorter (``--pretend-lengths``: the pretend device's decode
steps are Python dispatch, seconds each on a loaded 2-core host).

    .venv/bin/python bench/bench_long_text.py [--model SmolLM2-135M-Instruct] [--tokens 1024]
        [--cpu-lengths 128,1024] [--pretend-lengths 128,1024] [--quick]

``--quick``: 128 tokens, one probe each (a smoke run). Results: bench/results/long_text.json (long_text_quick.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, fixtures, write_results

#: torch's threads in each child: what a 1-worker sweep's probe gets on this 2-core host (cores /
#: (workers + host-check slots)); two threads spin against each other and the other processes of a
#: loaded host (the pretend device's decode step took 6 times as long with two, under a load of 8).
THREADS = 1
#: bf16-sized noise on every matrix product (the pretend device's relative error; 0.0039 is half of
#: bf16's epsilon).
NOISE = {
    "wrong_ops": dict.fromkeys(("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"), 0.0039)
}


def child(
    model: str, device: str, lengths: list[int], probes: int, data: str, prefill: int
) -> dict:
    """In a child process: the probe's device seconds, then the long text's at each length, and
    its rates; then the prefill alone over ``prefill`` positions, scored by windows."""
    import torch  # the child's environment turns torch's backend autoload off (run_child)

    from model_support.probe import agreement, devices, long_text, phases, probe_core, probe_params
    from model_support.probe.run import DEFAULTS, run_probe
    from model_support.record import schema

    os.environ["MODEL_SUPPORT_DATA_DIR"] = data
    torch.set_num_threads(THREADS)
    out: dict = {"device": device, "threads": torch.get_num_threads(), "probe": []}
    work = Path(tempfile.mkdtemp(prefix="bench-long-text-"))
    for k in range(probes):
        record = run_probe(
            model,
            record_path=str(work / f"r{k}.json"),
            device=device,
            reference="none",
            judge=False,
        )
        assert record["status"] == "PASS", record["error_message"]
        phase = phases.device_phase()
        out["probe"].append(
            {
                "device_s": round(phase["device_s"], 3),
                "perf_s": round(phase["parts"].get("perf", 0.0), 3),
                "generate_s": round(record["generate_s"], 3),
                "duration_s": round(record["duration_s"], 3),
            }
        )
    adapter = devices.resolve(device)
    settings = {
        **DEFAULTS,
        "device": device,
        "load_from": model,
        "model_id": model,
        "long_text": "on",
    }
    result = probe_core.run_stages(
        model_id=model,
        **probe_params.stage_settings(settings),
        device=adapter.torch_device,
        synchronize=adapter.synchronize if adapter.type != "cpu" else None,
        keep_model=True,
    )
    record = schema.empty_record(
        model_id=f"local:{Path(model).name}", device_type=adapter.type, status="PASS"
    )
    positions = probe_core.positions_of(result["model"])
    out["text_tokens"] = len(long_text.token_ids(result["tokenizer"], 10**6, None))
    out["long_text"] = {}
    for length in lengths:
        ids = long_text.token_ids(result["tokenizer"], length, positions)
        found = long_text.run_paths(
            result["model"],
            ids,
            adapter.torch_device,
            adapter.synchronize if adapter.type != "cpu" else None,
        )
        found.update(text=long_text.text_id(), ids=ids, mode="eager")
        began = time.perf_counter()
        reference, whence = long_text.reference_for(record, settings, ids)
        first_s = time.perf_counter() - began
        began = time.perf_counter()
        # the second probe's: read from the data folder
        long_text.reference_for(record, settings, ids)
        cached_s = time.perf_counter() - began
        compared = long_text.compare(found, reference, settings["numerics_margin"])
        out["long_text"][str(len(ids))] = {
            "prefill_s": round(found["prefill_s"], 3),
            "decode_s": round(found["decode_s"], 3),
            "device_s": round(found["device_s"], 3),
            "decode_step_ms": round(1e3 * found["decode_s"] / len(ids), 2),
            "reference_first_s": round(first_s, 2),
            "reference_cached_s": round(cached_s, 3),
            "reference": whence.split(" (")[0],
            **{k: v for k, v in compared.items() if k not in ("long_text_note", "long_text_text")},
        }
    ids = long_text.token_ids(result["tokenizer"], prefill, positions)
    began = time.perf_counter()
    with torch.inference_mode():
        logits = result["model"](
            input_ids=torch.tensor([ids], device=adapter.torch_device), use_cache=False
        ).logits[0]
        values, top = logits.topk(long_text.TOP_K, dim=-1)
        top, values = top.cpu().tolist(), values.float().cpu().tolist()
    prefill_s = time.perf_counter() - began
    reference, _ = long_text.reference_for(record, settings, ids)
    # each position's margin as the check has it: 0.5 nats or 0.15 of the reference's spread there,
    # the smaller
    spreads = reference.get("spreads") or [None] * len(ids)
    margins = [
        0.5 if w is None else min(0.5, agreement.DEFAULT_RELATIVE_MARGIN * w) for w in spreads
    ]
    rows = [
        long_text._position(
            top[p], values[p], reference["ids"][p], reference["logprobs"][p], margins[p]
        )
        for p in range(len(ids))
    ]
    flags = [r[0] for r in rows]
    within = [not r[2] for r in rows]  # the gated rate's: a near-tie flip agrees
    out["prefill_only"] = {
        "tokens": len(ids),
        "device_s": round(prefill_s, 3),
        "top1": round(sum(flags) / len(ids), 4),
        "top5": round(sum(r[1] for r in rows) / len(ids), 4),
        "top1_windows": [round(w, 4) for w in long_text.windows(flags)],
        "windows": [round(w, 4) for w in long_text.windows(within)],
        "rate": round(min(long_text.windows(within)), 4),
        "top1_rate": round(min(long_text.windows(flags)), 4),
        "flips": [p for p, agrees in enumerate(flags) if not agrees],
        "diverges_at": next((p for p, r in enumerate(rows) if r[2]), None),
    }
    return out


def run_child(
    model: str,
    device: str,
    lengths: list[int],
    probes: int,
    data: Path,
    pretend: dict | None,
    prefill: int,
) -> dict:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HF_HUB_OFFLINE": "1"}
    if pretend is not None:
        env["MODEL_SUPPORT_PRETEND"] = json.dumps(pretend)
    args = [
        sys.executable,
        __file__,
        "--child",
        model,
        device,
        ",".join(map(str, lengths)),
        str(probes),
        str(data),
    ]
    args.append(str(prefill))
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        model, device, lengths, probes, data, prefill = sys.argv[2:8]
        print(
            json.dumps(
                child(
                    model,
                    device,
                    [int(n) for n in lengths.split(",")],
                    int(probes),
                    data,
                    int(prefill),
                )
            )
        )
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument(
        "--cpu-lengths", default="", help="the long text's lengths on the CPU (default: 128,TOKENS)"
    )
    parser.add_argument(
        "--pretend-lengths",
        default="",
        help="... on the pretend device (the noise run: the longest)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="128 tokens, one probe each: a smoke run"
    )
    args = parser.parse_args()
    tokens, probes = (128, 1) if args.quick else (args.tokens, 2)

    def lengths(given: str) -> list[int]:
        return (
            sorted({int(n) for n in given.split(",")})
            if given
            else sorted({min(128, tokens), tokens})
        )

    cpu, pretend_lengths = lengths(args.cpu_lengths), lengths(args.pretend_lengths)
    model = fixtures()[args.model]["path"]
    data = Path(tempfile.mkdtemp(prefix="bench-long-text-data-"))
    runs = {}
    for label, device, pretend, asked in (
        ("cpu", "cpu", None, cpu),
        ("pretend", "pretend", {}, pretend_lengths),
        ("pretend_noise", "pretend", NOISE, pretend_lengths[-1:]),
    ):
        print(f"== {label}", flush=True)
        runs[label] = run_child(model, device, asked, probes, data, pretend, tokens)
        print(json.dumps(runs[label]), flush=True)
    results: dict = {"model": args.model, "tokens": tokens, "runs": runs, "ratio": {}}
    for label in ("cpu", "pretend"):
        run = runs[label]
        probe_s = statistics.median(p["device_s"] for p in run["probe"])
        for n, found in run["long_text"].items():
            results["ratio"][f"{label}_{n}"] = round(found["device_s"] / probe_s, 2)
        results["ratio"][f"{label}_prefill_{tokens}"] = round(
            run["prefill_only"]["device_s"] / probe_s, 3
        )
    longest = str(pretend_lengths[-1])
    clean, noisy = (
        runs["pretend"]["long_text"][longest],
        runs["pretend_noise"]["long_text"][longest],
    )
    results["noise"] = {
        "both_paths_tokens": int(longest),
        **{
            key: round(noisy[key] - clean[key], 4)
            for key in (
                "long_text_rate",
                "long_text_decode_top1",
                "long_text_prefill_top1",
                "long_text_decode_top5",
            )
        },
        "diverges_at": [
            noisy["long_text_decode_diverges_at"],
            noisy["long_text_prefill_diverges_at"],
        ],
        "prefill_tokens": tokens,
        "prefill_rate": round(
            runs["pretend_noise"]["prefill_only"]["rate"] - runs["pretend"]["prefill_only"]["rate"],
            4,
        ),
        "prefill_windows_moved": [
            round(b - a, 4)
            for a, b in zip(
                runs["pretend"]["prefill_only"]["windows"],
                runs["pretend_noise"]["prefill_only"]["windows"],
            )
        ],
    }
    write_results("long_text_quick" if args.quick else "long_text", results)


if __name__ == "__main__":
    main()
