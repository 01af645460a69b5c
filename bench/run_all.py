"""``make bench``: run the four benchmarks in turn, then write their numbers into bench/README.md.

The tables in bench/README.md are generated from bench/results/*.json, i.e. from what the scripts
printed in this run; nothing in them is typed by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from common import HERE, RESULTS

SCRIPTS = [
    "bench_probe.py",
    "bench_sweep.py",
    "bench_analysis.py",
    "bench_runner_memory.py",
    "bench_hub_prefetch.py",
    "bench_modes.py",
    "bench_scheduler.py",
    "bench_cold_command.py",
    "bench_numerics.py",
    "bench_judge.py",
    "bench_tasks.py",
    "bench_pretend.py",
    "bench_phases.py",
    "bench_row_bytes.py",
    "bench_ops.py",
    "bench_bisect.py",
    "bench_zygote.py",
    "bench_localise.py",
    "bench_ops_prove.py",
    "bench_perf.py",
    "bench_perf.py --device pretend",
    "bench_perf_cost.py",
    "bench_instruments.py",
    "bench_exports.py",
    "bench_as_typed.py",
    # its table is written by hand in bench/README.md (outside the generated block)
    "bench_long_text.py",
    "bench_long_text_late_fault.py",  # likewise
]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ok(flag) -> str:
    return "met" if flag else ("**not met**" if flag is not None else "-")


def cold_command_table(cold: dict) -> list[str]:
    """bench_cold_command.py: the papermill probe against its repro script, like for like and as
    typed, and where its time goes; with the baseline notebook's rounds ("before") where it ran
    one."""
    if not cold or "parts" not in cold:
        return []
    r = cold["repro_script_s"]
    runs = {"after": cold, "after, as typed (judge on)": cold["as_typed"]}
    if "before" in cold:
        runs = {"before": cold["before"], "before, as typed": cold["before"]["as_typed"], **runs}

    def wall(s: dict) -> str:
        return f"{s['median']:.2f} s [{s['min']:.2f}-{s['max']:.2f}]"

    lines = [
        f"### The headline command, cold ({cold['date']}, {cold['model']}, {cold['reps']} "
        "rounds, interleaved, median [min-max])",
        "",
        "Like for like: `-p reference none -p judge False`, neither of which the repro script "
        "runs; as typed: the judge on, its default (the difference is the judge, the probe's "
        "own work).",
        "",
        "| command | wall | over the repro script | CPU | over the repro script |",
        "|---|---|---|---|---|",
        f"| `python repro.py ...` (the record's repro script) | {wall(r)} | | "
        f"{wall(cold['repro_script_cpu_s'])} | |",
    ]
    for name, run in runs.items():
        judge = f", the judge {run['judge_s']:+.2f} s" if "judge_s" in run else ""
        judge_cpu = f", the judge {run['judge_cpu_s']:+.2f} s" if "judge_cpu_s" in run else ""
        lines.append(
            f"| `papermill notebooks/probe.ipynb ...`, {name} | {wall(run['papermill_probe_s'])} "
            f"| {run['overhead_s']:+.2f} s ({run['ratio']:.2f}x){judge} | {wall(run['cpu_s'])} "
            f"| {run['cpu_overhead_s']:+.2f} s{judge_cpu} |"
        )
    lines += [
        "",
        "Where the papermill probe's time goes (median seconds):",
        "",
        "| part | " + " | ".join(runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    lines += [
        f"| {said} | " + " | ".join(f"{run['parts_s'][part]:.2f}" for run in runs.values()) + " |"
        for part, said in cold["parts"].items()
    ]
    lines += [
        "",
        "The papermill probe over its repro script, like for like: "
        f"**{cold['overhead_s']:+.2f} s** (target <= {cold['target_s']} s: {ok(cold['met'])})",
        "",
    ]
    return lines


def tables() -> str:
    lines = []
    probe = load("probe_overhead")
    if probe:
        lines += [
            f"### Probe overhead ({probe['date']}, {probe['reps']} repetitions, median [min-max])",
            "",
            "Warm: the probe's process was started ahead and has warmed up, as a sweep "
            "worker's next process does while the current model runs (the steady state of a "
            "sweep; targets judged here). Cold: the process starts when the model is handed "
            "over (a worker's first model).",
            "",
            "| model | probe, warm | probe, cold | repro script, plain python | ratio warm / "
            "cold | overhead warm / cold | target |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, name, target in (
            ("smollm2", "SmolLM2-135M-Instruct", "ratio <= 1.10x"),
            ("tiny", "tiny-llama", "overhead <= 1.5 s"),
        ):
            r = probe[label]
            key = "smollm2_ratio" if label == "smollm2" else "tiny_overhead_s"
            cell = lambda d: f"{d['median']:.2f} s [{d['min']:.2f}-{d['max']:.2f}]"  # noqa: E731
            lines.append(
                f"| {name} | {cell(r['warm_probe_s'])} | {cell(r['probe_s'])} | "
                f"{cell(r['repro_s'])} | {r['warm_ratio']:.3f}x / {r['ratio']:.3f}x | "
                f"{r['warm_overhead_s']:+.2f} s / {r['overhead_s']:+.2f} s | {target}: warm "
                f"{ok(probe['met'][key])}, cold {ok(probe['met']['cold_' + key])} |"
            )
        lines += [
            "",
            "Where the cold probe's time goes (median seconds):",
            "",
            "| part | SmolLM2 | tiny-llama |",
            "|---|---|---|",
        ]
        for part in probe["tiny"]["breakdown_s"]:
            lines.append(
                f"| {part} | {probe['smollm2']['breakdown_s'][part]['median']:.3f} | "
                f"{probe['tiny']['breakdown_s'][part]['median']:.3f} |"
            )
        lines.append("")
    sweep = load("sweep_scaling")
    if sweep:
        lines += [
            f"### Sweep scaling ({sweep['date']}, {sweep['params']}, "
            f"{sweep['local_1']['models']} models)",
            "",
            "| run | wall time |",
            "|---|---|",
        ]
        for label in ("local_1", "local_2", "ray_2"):
            lines.append(
                f"| {label.replace('_', ', ')} worker(s) | {sweep[label]['wall_s']:.1f} s |"
            )
        if "local_2_every_core" in sweep:
            lines.append(
                "| local, 2 workers, each using every core | "
                f"{sweep['local_2_every_core']['wall_s']:.1f} s |"
            )
        lines += [
            "",
            f"- 2 workers vs 1: **{sweep['speedup_2_workers']:.2f}x** faster (target >= 1.7x: "
            f"{ok(sweep['met']['speedup_2_workers'])})",
            f"- Ray vs local (2 workers each): **{sweep['ray_over_local']:.2f}x** the wall "
            f"time (target <= 1.15x: {ok(sweep['met']['ray_over_local'])})",
        ]
        if "shared_over_every_core" in sweep:
            lines.append(
                "- 2 workers sharing the cores vs each using every core: "
                f"**{sweep['shared_over_every_core']:.2f}x** the wall time"
            )
        lines.append("")
    analysis = load("analysis")
    if analysis:
        t, r, e, b, p = (
            analysis.get(k, {}) for k in ("tables", "render", "explorer", "browser", "pandas")
        )
        lines += [
            f"### Analysis at scale ({analysis['date']}, {analysis['sweeps']} sweeps x "
            f"{analysis['models']} models, {t.get('rows', 0):,} rows, "
            f"{analysis.get('parquet_mb')} MB Parquet)",
            "",
            "| step | measured | target |",
            "|---|---|---|",
            f"| load all sweeps + every report table (Polars) | {t['median_s']:.2f} s "
            f"[{t['min_s']:.2f}-{t['max_s']:.2f}], peak {t['peak_rss_mb']:.0f} MB | < 3 s, < "
            f"1500 MB: {ok(t['median_s'] < 3 and t['peak_rss_mb'] < 1500)} |",
            f"| the same aggregations in pandas | {p['median_s']:.2f} s, peak "
            f"{p['peak_rss_mb']:.0f} MB | reference |",
            "| render the whole report (papermill + nbconvert + explorer) | "
            f"{r['median_s']:.1f} s [{r['min_s']:.1f}-{r['max_s']:.1f}] | < 30 s: "
            f"{ok(r['median_s'] < 30)} |",
            f"| explorer page size | {e['bytes'] / 1e6:.2f} MB | < 10 MB: "
            f"{ok(e['bytes'] < 10e6)} |",
        ]
        if "search" in b:
            lines.append(
                "| search in Chromium (typed to match count shown) | "
                f"{1000 * b['search']['median_s']:.0f} ms median, filter + redraw "
                f"{1000 * b['update']['median_s']:.1f} ms | responsive |"
            )
        lines.append("")
    memory = load("runner_memory")
    if memory:
        lines += [
            f"### Runner memory over a long sweep ({memory['date']}, fake fast probe)",
            "",
            "| models | runner peak RSS | wall |",
            "|---|---|---|",
        ]
        for row in memory["rows"]:
            lines.append(
                f"| {row['count']} | {row['peak_rss_mb']:.1f} MB | {row['wall_s']:.1f} s |"
            )
        lines += [
            "",
            f"Growth from {memory['rows'][0]['count']} to {memory['rows'][-1]['count']} models: "
            f"{memory['growth_mb']:+.1f} MB (target flat: {ok(memory['met'])})",
            "",
        ]
    prefetch = load("hub_prefetch")
    if prefetch:
        off, on = prefetch["prefetch_0"], prefetch["prefetch_1"]
        lines += [
            f"### Hub sweep with prefetch ({prefetch['date']}, {prefetch['models']} Hub "
            "fixtures from the local Hub throttled to "
            f"{prefetch['throttle_bytes_per_s'] / 1e3:.0f} KB/s, 1 worker, `model-support "
            "sweep`)",
            "",
            "| run | wall | median download_s | median probe duration_s |",
            "|---|---|---|---|",
            f"| --prefetch 0 | {off['wall_s']:.1f} s | {off['download_s_median']:.2f} s | "
            f"{off['probe_s_median']:.2f} s |",
            f"| --prefetch 1 | {on['wall_s']:.1f} s | {on['download_s_median']:.2f} s | "
            f"{on['probe_s_median']:.2f} s |",
            "",
            f"Prefetch on vs off: **{prefetch['speedup']:.2f}x** faster (target >= "
            f"{prefetch['target']}x: {ok(prefetch['met'])})",
            "",
        ]
    lines += cold_command_table(load("cold_command"))
    modes = load("modes")
    if modes:
        lines += [
            f"### Execution modes ({modes['date']}, {modes['model']} on CPU, "
            f"{modes['max_new_tokens']} new tokens, one papermill probe each)",
            "",
            "| variant | verdict | first token (incl. compile) | decode | graphs | "
            "recompilations | breaks | matches eager | probe wall |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in modes["rows"]:
            decode = f"{r['decode_tokens_per_s']:.1f} tok/s" if r["decode_tokens_per_s"] else "-"
            lines.append(
                f"| {r['variant']} | {r['status']} | {r['first_token_s']:.2f} s | {decode} | "
                f"{r['graphs'] if r['graphs'] is not None else '-'} | "
                f"{r['recompilations'] if r['recompilations'] is not None else '-'} | "
                f"{r['graph_breaks'] if r['graph_breaks'] is not None else '-'} | "
                f"{r['matches_eager'] if r['matches_eager'] is not None else '-'} | "
                f"{r['wall_s']:.0f} s |"
            )
        lines.append("")
    lines += tasks_table(load("tasks"))
    lines += row_bytes_table(load("row_bytes"))
    pretend = load("pretend")
    if pretend:
        lines += [
            f"### The pretend accelerator against the CPU ({pretend['date']}, "
            f"{pretend['reps']} repetitions, median [min-max], the probe's stages in one "
            "process)",
            "",
            "| model | load, cpu | load, pretend | generate, cpu | generate, pretend | ratio "
            "(medians / fastest) | operators per generation | overhead per operator (fastest "
            "runs) | tokens |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        cell = lambda d: f"{d['median']:.2f} s [{d['min']:.2f}-{d['max']:.2f}]"  # noqa: E731
        for name, r in pretend["models"].items():
            lines.append(
                f"| {name} | {cell(r['load_s']['cpu'])} | {cell(r['load_s']['pretend'])} | "
                f"{cell(r['generate_s']['cpu'])} | {cell(r['generate_s']['pretend'])} | "
                f"{r['generate_ratio']:.2f}x / {r['generate_ratio_min']:.2f}x | "
                f"{r['ops_per_generation']:,} | {r['us_per_op']:.0f} us | "
                f"{'equal' if r['tokens_equal'] else 'differ'} |"
            )
        lines.append("")
    lines += ops_table(load("ops"))
    lines += localise_table(load("localise"))
    lines += ops_prove_table(load("ops_prove"))
    lines += as_typed_table(load("as_typed"))
    scheduler = load("scheduler")
    if scheduler and "table" in scheduler:
        lines += [
            f"### Multi-device scheduling by simulation ({scheduler['date']})",
            "",
            scheduler["table"],
            "",
        ]
    numerics = load("numerics")
    if numerics and "table" in numerics:
        lines += [
            f"### Is a PASS right? The reference check's thresholds and cost ({numerics['date']})",
            "",
        ]
        lines += [numerics["table"], ""]
    bisect = load("bisect")
    if bisect:
        lines += [
            f"### model-support bisect: {bisect['models']} models over "
            f"{bisect['releases_between']} releases ({bisect['date']}, {bisect['candidates']} "
            f"differing packages, goal < {bisect['goal_s']} s)",
            "",
            "| environments | wall | load average | runs (per model) | repro script, median | "
            "scripts, total | environments, total | CPU (children) | idle-machine estimate | "
            "right answer | goal (wall / idle) |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for label in ("cold", "warm"):
            r = bisect.get(label)
            if not r:
                continue
            lines.append(
                f"| {label} | {r['wall_s']:.1f} s | {r['load_average']} | {r['runs']} "
                f"({r['runs_per_model']}) | {r['run_s_median']:.2f} s | "
                f"{r['runs_s_total']:.1f} s | {r['env_s_total']:.1f} s | {r['cpu_s']:.1f} s | "
                f"{r['idle_estimate_s']:.1f} s | {'yes' if r['right'] else 'no'} | "
                f"{ok(r['wall_s'] < bisect['goal_s'])} / "
                f"{ok(r['idle_estimate_s'] < bisect['goal_s'])} |"
            )
        lines.append("")
    judge = load("judge")
    if judge and "table" in judge:
        lines += [
            f"### The fluency judge on its labelled set ({judge['date']})",
            "",
            judge["table"],
            "",
        ]
    lines += phases_table(load("phases")) + phases_table(load("phases_ray"))
    lines += device_check_table(load("device_check")) + zygote_table(load("zygote"))
    lines += (
        perf_table(load("perf"))
        + perf_table(load("perf_pretend"))
        + perf_cost_table(load("perf_cost"))
    )
    lines += instruments_table(load("instruments"))
    lines += exports_table(load("exports"))
    return "\n".join(lines)


def exports_table(found: dict) -> list[str]:
    """bench_exports.py: the commands a CI reads the dataset with, as typed (a fresh process, its
    imports in)."""
    if not found:
        return []
    lines = [
        f"### Exports and the support card ({found['date']}, {found['reps']} repeats, median "
        "[min-max] seconds)",
        "",
        "| history | command | export junit | markdown | csv | json | support MODEL | goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in ("smoke", "large"):
        r = found.get(label)
        if not r:
            continue
        for kind in ("command_s", "library_s"):
            cells = " | ".join(
                f"{r[kind][k]['median']:.2f} [{r[kind][k]['min']:.2f}-{r[kind][k]['max']:.2f}]"
                for k in ("junit", "markdown", "csv", "json", "support")
            )
            goal = (
                f"< {found['goal_s']:g} s: {ok(found['met']['smoke_command_under_goal'])}"
                if label == "smoke"
                else ""
            )
            what = "the command" if kind == "command_s" else "the library call"
            lines.append(
                f"| {r['sweeps']} sweeps x {r['models']} models | {what} | {cells} | "
                f"{goal if kind == 'command_s' else ''} |"
            )
    return [*lines, ""]


def instruments_table(found: dict) -> list[str]:
    """bench_instruments.py: each instrument's share of a probe, before and after, on the command
    users type."""
    if not found or "devices" not in found:
        return []
    lines = [
        f"### The probe's instruments ({found['date']}, `model-support sweep` of "
        f"{', '.join(found['models'])}; {found['reps']} runs of each configuration, "
        f"interleaved, and {found['stage_reps']} of the stages alone; medians)",
        "",
        "| device | instrument | state | timed alone: CPU s a sweep | share of the command's "
        "CPU (goal <= 5%) | share of the probes' stages | the command with / without it: CPU "
        "s | its CPU (paired) | wall | probes' wall |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def figure(part: dict) -> str:
        return f"{part['paired_extra_s']:+.2f} s, {part['paired_share']:+.1%}"

    for device, measured in found["devices"].items():
        configs = measured["configs"]
        for s in measured["shares"]:
            pair = " / ".join(
                f"{configs[c]['command_cpu_s']['median']:.1f}" for c in (s["with"], s["without"])
            )
            lines.append(
                f"| {device} | {s['instrument']} | {s['state']} | "
                f"{s['alone']['extra_cpu_s']:+.3f} | {s['alone']['share']:.1%} | "
                f"{s['alone']['share_of_stages']:.1%} | {pair} | {figure(s['command_cpu_s'])} "
                f"| {figure(s['command_s'])} | {figure(s['probes_s'])} |"
            )
    micro = found.get("micro_us_per_op") or {}
    lines += [
        "",
        "CPU seconds per operator (a CPU `add`, in one process): "
        + ", ".join(f"{k} {v} us" for k, v in micro.items()),
        "",
    ]

    def shares(by_device) -> str:
        if not isinstance(by_device, dict):
            return by_device
        return ", ".join(
            f"{d} {v['share']:.1%} of the command ({v['share_of_stages']:.0%} of the stages)"
            for d, v in by_device.items()
        )

    lines.append("Each instrument (timed alone, over the command's CPU seconds), before / after:")
    lines.append("")
    for name, verdict in found["instruments"].items():
        why = f": {verdict['why']}" if verdict.get("why") else ""
        lines.append(
            f"- {name} (default {verdict['default']}): {ok(verdict['met'])}. Before: "
            f"{shares(verdict['before'])}. After: {shares(verdict['after'])}{why}."
        )
    return [*lines, ""]


def perf_cost_table(found: dict) -> list[str]:
    """bench_perf_cost.py: a decode-bound sweep with the perf phase's defaults against ``perf:
    off``."""
    if not found:
        return []
    on, off = found["runs"]["default"], found["runs"]["perf_off"]
    met = found["met"]
    lines = [
        f"### What the perf phase costs a decode-bound sweep ({found['date']}, "
        f"{found['models']} models, {found['devices']} pretend devices, every matrix product "
        f"{1e3 * found['matmul_s']:.0f} ms)",
        "",
        f"`model-support sweep` with the defaults: {on['wall_s']:.0f} s; with `perf: off`: "
        f"{off['wall_s']:.0f} s; ratio {found['ratio']:.2f} (goal <= 1.25): "
        f"{ok(met['ratio'])}. Every PASS with TTFT and TPOT ({on['passes_timed']} of "
        f"{on['passes']}): {ok(met['every_pass_timed'])}. Held idle "
        f"{100 * (found['held_idle_share'] or 0):.1f}% of the held time with the perf phase "
        f"({found['perf_device_s']} device-s) counted as device work (goal <= 10%): "
        f"{ok(met['held_idle_share'])}.",
        "",
        "| model | repeats (why stopped) | TTFT | TPOT | TPOT spread | perf phase / verdict's "
        "generation (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in on["per_model"].items():
        spread = f"{m['tpot_spread']:.1%}" if m["tpot_spread"] is not None else "-"
        lines.append(
            f"| {name} | {m['repeats']} ({m['stop']}) | {m['ttft_ms']} ms | {m['tpot_ms']} ms "
            f"| {spread} | {m['perf_device_s']} / {m['verdict_generate_s']} |"
        )
    return lines + [""]


def perf_table(found: dict) -> list[str]:
    """bench_perf.py: the perf phase's cost per probe and TPOT's spread over the repeats it chose
    (smoke list, on the CPU or the pretend device)."""
    if not found:
        return []
    device = {"cpu": "CPU", "pretend": "pretend device, its modelled clock"}[
        found.get("device", "cpu")
    ]
    sized = "perf_spread" in found  # measured since the phase sizes itself (issue 47)
    tokens = "/".join(map(str, found.get("repeat_tokens") or [found.get("perf_tokens")]))
    cpu = found.get("device", "cpu") == "cpu"
    budget = f"{found.get('perf_budget', 0):.0%} of the probe's device " + (
        "time (the whole probe on the CPU)" if cpu else "phase"
    )
    how = (
        f"repeats of {tokens} token{'' if tokens == '1' else 's'} until TPOT's spread is "
        f"within {found['perf_spread']:.0%}, at most {found['perf_repeats']}, {budget}"
        if sized
        else f"{found['perf_repeats']} repeats of {found['perf_tokens']} tokens after a warm-up"
    )
    lines = [
        f"### The perf phase ({found['date']}, {device}, {how}, {found['reps']} probes each way)",
        "",
        "| model | probe without / with it (median s) | its cost | share of a probe (goal < "
        "20%) | TPOT | TPOT spread (median / worst; goal <= 5%) | TPOT across probes | TPOT "
        "CV | repeats (why stopped) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in found["models"].items():
        if "error" in m:
            lines.append(f"| {name} | failed: {m['error'][-200:]} | | | | | | | |")
            continue
        ran = (
            ", ".join(f"{n} ({why})" for n, why in zip(m.get("repeats", []), m.get("stops", [])))
            or "-"
        )
        worst = f" / {m['tpot_spread_worst']:.1%}" if "tpot_spread_worst" in m else ""
        across = f"{m['tpot_across_probes']:.1%}" if "tpot_across_probes" in m else "-"
        lines.append(
            f"| {name} | {m['probe_off_s']['median']:.2f} / {m['probe_on_s']['median']:.2f} | "
            f"{m['perf_cost_s']:+.2f} s | {m['perf_share']:.1%} | {m['tpot_ms']:.2f} ms | "
            f"{m['tpot_spread']:.1%}{worst} | {across} | {m['tpot_cv']:.1%} | {ran} |"
        )
    met = found["met"]
    threads = "/".join(map(str, found.get("cpu_threads") or [])) or "-"
    lines += [
        "",
        f"Under a fifth of a probe: {ok(met['perf_share_under_a_fifth'])}; TPOT CV under 5%: "
        f"{ok(met['tpot_cv_under_5pct'])}; TPOT spread within 5% in every run: "
        f"{ok(met.get('tpot_spread_within_5pct'))} ({found.get('probes_within_5pct') or '-'} "
        f"probes, torch's CPU threads {threads}); the probes' TPOT within 5% of each other "
        f"(not chosen by the stop rule): {ok(met.get('tpot_across_probes_within_5pct'))}.",
        "",
    ]
    return lines


def zygote_table(found: dict) -> list[str]:
    """bench_zygote.py: `model-support sweep` with kernels forked from the zygote vs fresh
    kernels."""
    if not found:
        return []
    cpu, wall = found["cpu_s"], found["wall_s"]
    return [
        f"### Kernels forked from the zygote ({found['date']}, `model-support sweep` of "
        f"{len(found['models'])} fixtures, 2 workers)",
        "",
        "| kernels | CPU s (median) | wall s (median) |",
        "|---|---|---|",
        f"| fresh (`MODEL_SUPPORT_KERNEL_ZYGOTE=off`) | {cpu['fresh']['median']:.1f} | "
        f"{wall['fresh']['median']:.1f} |",
        f"| forked from the zygote | {cpu['zygote']['median']:.1f} | "
        f"{wall['zygote']['median']:.1f} |",
        "",
        f"CPU {found['cpu_ratio']:.2f}x, wall {found['wall_ratio']:.2f}x; the same records "
        "field for field (timings and peak host memory aside): "
        f"{'yes' if found['same_records'] else '**no**'}. Target: at most {found['target']}x "
        f"the CPU with the same records ({ok(found['met'])}).",
        "",
    ]


def row_bytes_table(found: dict) -> list[str]:
    """Parquet bytes per row, one line per measurement: the ``results`` config's rows (the goal),
    ``results`` and ``excluded`` together, every config (``ops`` too), the footers' share and the
    repro script's."""
    if not found:
        return []
    lines = [
        f"### Parquet bytes per row ({found['date']})",
        "",
        "| measurement | sweep | rows (results / excluded / ops) | Parquet bytes | footers | "
        "results bytes per row | results + excluded per row | all configs per row | "
        "repro_script chars per row | repro_settings chars per row | repro bodies (bytes) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, run in found["runs"].items():
        sweep = run["fixtures"] if isinstance(run["fixtures"], str) else ", ".join(run["fixtures"])
        configs = run.get("configs")
        rows = (
            " / ".join(
                f"{configs.get(c, {}).get('rows', 0)}" for c in ("results", "excluded", "ops")
            )
            if configs
            # an older entry, from before the ops config: results and excluded
            else f"{run['rows']} (together)"
        )
        footer = f"{run['footer_bytes']:,}" if "footer_bytes" in run else "-"
        per_row = run.get("results_bytes_per_row")
        lines.append(
            f"| {label} | {sweep} | {rows} | {run['parquet_bytes']:,} | {footer} | "
            f"{f'{per_row:,}' if per_row is not None else '-'} | "
            f"{run.get('record_bytes_per_row', run['bytes_per_row']):,} | "
            f"{run['bytes_per_row']:,} | {run['repro_script_chars_per_row']:,} | "
            f"{run['repro_settings_chars_per_row']:,} | {run['repro_bodies']} "
            f"({run['repro_body_bytes']:,}) |"
        )
    lines += [
        "",
        "Where the bytes went (compressed bytes over every file, the costliest columns first):",
        "",
    ]
    lines += [
        f"- {label}: "
        + ", ".join(f"`{name}` {size:,}" for name, size in run["top_columns"].items())
        for label, run in found["runs"].items()
        if "top_columns" in run
    ]
    return [*lines, ""]


def phases_table(phases: dict) -> list[str]:
    """bench_phases.py: held-idle share and utilisation, the host checks inside the hold vs after
    it."""
    if not phases:
        return []
    on_ray = phases.get("executor") == "ray"
    lines = [
        f"### A device held for the device's work only{' under Ray' if on_ray else ''} "
        f"({phases['date']}, 2 pretend devices, reference and judge on, {phases['cores']} "
        f"cores shared with other work: load average {_load(phases)} at the start)",
        "",
        "| scenario | run | held-idle share | utilisation | span / ideal | held | device "
        "phases | not held | checks after release | PASS checked | host CPU busy | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in phases["scenarios"].items():
        for label in ("before", "after"):
            r = runs[label]
            lines.append(
                f"| {name} ({runs['models']} models, {runs['attention_s']} s per bmm) | "
                f"{label} | {100 * r['held_idle_share']:.0f}% | {100 * r['utilisation']:.0f}% "
                f"| {r['span_over_ideal']:.2f}x | {r['held_s']:.0f} s | {r['device_s']:.0f} s "
                f"| {r['unheld_s']:.0f} s | {r['checks_after_release']} | "
                f"{r['passes_checked']}/{r['passes']} | {100 * r['host_cpu_busy']:.0f}% | "
                f"{r['wall_s']:.0f} s |"
            )
    met = phases["met"]
    lines += [
        "",
        f"Targets: held-idle share <= 10% after ({ok(met['held_idle_share'])}); device-bound "
        f"utilisation >= 90% ({ok(met['utilisation'])}) and span within 15% of the ideal "
        f"({ok(met['span_over_ideal'])}); every PASS checked against the reference "
        f"({ok(met['every_pass_checked'])})."
        + (f" {phases['host_bound']}." if phases.get("host_bound") else ""),
        "",
    ]
    return lines


def _load(results: dict) -> str:
    loads = [
        r["load_before"] for s in results["scenarios"].values() for r in (s["before"], s["after"])
    ]
    return f"{min(loads)}-{max(loads)}"


def device_check_table(check: dict) -> list[str]:
    """device_check.sh on a CUDA GPU (a dry run on the pretend device is not reported here)."""
    if not check or check.get("dry_run"):
        return [
            "### The device check on a CUDA GPU",
            "",
            "Not run yet on a GPU: `bench/device_check.sh` there.",
            "",
        ]
    steps = check["steps"]
    lines = [
        f"### The device check on a CUDA GPU ({check['date']}, {check.get('gpu')}, "
        f"{check['wall_s']:.0f} s)",
        "",
    ]
    lines += ["| step | result |", "|---|---|"]
    for name, step in steps.items():
        shown = (
            step.get("error")
            or step.get("skipped")
            or json.dumps({k: v for k, v in step.items() if k != "traceback"}, default=str)
        )
        lines.append(f"| {name} | {shown[:400]} |")
    return [*lines, ""]


def tasks_table(tasks: dict) -> list[str]:
    """bench_tasks.py: the probe's cost for a VLM against a text model with the same language
    model."""
    if not tasks:
        return []
    cell = lambda d: f"{d['median']:.3f} [{d['min']:.3f}-{d['max']:.3f}]"  # noqa: E731
    lines = [
        f"### Image-text-to-text against text-generation ({tasks['date']}, CPU, "
        f"{tasks['reps']} runs of the stages in one warm process, {tasks['command_reps']} of "
        "the papermill command, alternating; median [min-max] s)",
        "",
        "| model | task | parameters | tokens in (image) | load | template | first token | "
        "generate | decode tok/s | papermill probe (with CPU reference) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in tasks["models"].items():
        st = m["stages"]
        lines.append(
            f"| {name} | {m['task']} | {m['num_params']:,} | {m['tokens_in']} "
            f"({m['image_tokens'] or 0}) | {cell(st['load_s'])} | {cell(st['template_s'])} | "
            f"{cell(st['first_token_s'])} | {cell(st['generate_s'])} | "
            f"{st['decode_tokens_per_s']['median']:.1f} | {cell(m['command_s'])} |"
        )
    lines += ["", f"Ratios VLM / {tasks['text']} (medians):", ""]
    for vlm, ratios in tasks["ratios"].items():
        lines.append(
            f"- {vlm}: " + ", ".join(f"{k.removesuffix('_s')} {v:.2f}x" for k, v in ratios.items())
        )
    lines += [
        "",
        "Drawing the probe image (224x224, integer arithmetic): "
        f"{1000 * tasks['probe_image_s']:.0f} ms.",
        "",
    ]
    return lines


def write_readme() -> None:
    readme = HERE / "README.md"
    text = readme.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    readme.write_text(text[:start] + "\n" + tables() + "\n" + text[end:])


def localise_table(loc: dict) -> list[str]:
    """bench_localise.py: ``model-support localise`` end to end per model, under bf16-sized noise
    on every matmul."""
    if not loc:
        return []
    lines = [
        f"### The first wrong operator: `model-support localise` per model ({loc['date']}, "
        f"pretend device, bf16-sized noise on every matmul; goal under {loc['goal_s']:.0f} s "
        "each)",
        "",
        "| model | command (fresh process) | forward with every operator replayed | operators "
        "checked | flagged |",
        "|---|---|---|---|---|",
    ]
    for name, r in loc["models"].items():
        if "command_s" not in r:
            lines.append(f"| {name} | skipped: {r['skipped']} | | | |")
            continue
        lines.append(
            f"| {name} | {r['command_s']:.1f} s | {r['forward_s']:.2f} s | "
            f"{r['ops_checked']:,} | {r['operator'] or 'none'}"
            + (f" (the forward raised: {r['forward_raised']})" if r.get("forward_raised") else "")
            + " |"
        )
    two = loc["smollm2_two_percent"]
    lines += [
        "",
        f"Under a minute each: {ok(loc['met']['under_a_minute_each'])}; nothing flagged under "
        f"bf16-sized noise: {ok(loc['met']['no_false_alarm_under_bf16_noise'])}; SmolLM2 with "
        f"every matmul off by 2%: {two.get('operator')} in {two.get('module')} "
        f"({two.get('command_s')} s): {ok(loc['met']['two_percent_named'])}.",
        "",
    ]
    return lines


def ops_prove_table(found: dict) -> list[str]:
    """bench_ops_prove.py: ``model-support ops SWEEP --prove`` on a four-model sweep with two
    missing operators."""
    if not found:
        return []
    cell = lambda d: f"{d['median']:.1f} s [{d['min']:.1f}-{d['max']:.1f}]"  # noqa: E731
    steps = "; ".join(f"{s['op']} ({s['unlocks']} models): {s['outcome']}" for s in found["steps"])
    return [
        f"### The plan proven by running: `model-support ops SWEEP --prove` ({found['date']}, "
        f"pretend device lacking {' and '.join(found['stack']['missing_ops'])}, "
        f"{', '.join(found['models'])}; {found['workers']} workers, {found['reps']} "
        "repetitions from the stack's sweep alone, median [min-max]; load average "
        f"{found['load_average']})",
        "",
        "| the stack's sweep (4 probes) | `--prove` (fresh process) | what-if sweeps / probes "
        "| `--prove` again (read back) | steps |",
        "|---|---|---|---|---|",
        f"| {found['stack_sweep_s']:.1f} s | {cell(found['prove_s'])} | "
        f"{found['what_if_sweeps']} / {found['probes']} | {found['prove_again_s']:.1f} s | "
        f"{steps} |",
        "",
        f"Every step confirmed: {ok(found['met']['every_step_confirmed'])}; within a few "
        f"minutes (goal under {found['goal_s']:.0f} s): "
        f"{ok(found['met']['within_a_few_minutes'])}.",
        "",
    ]


def as_typed_table(found: dict) -> list[str]:
    """bench_as_typed.py: ``ops SWEEP --prove`` typed with the autoload unset against exported as
    0 (torch_tpu in)."""
    if not found:
        return []
    cell = lambda d: f"{d['median']:.1f} s [{d['min']:.1f}-{d['max']:.1f}]"  # noqa: E731
    return [
        "### As typed: `ops SWEEP --prove` with `TORCH_DEVICE_BACKEND_AUTOLOAD` unset "
        f"({found['date']}, torch_tpu installed, pretend device lacking "
        f"{' and '.join(found['stack']['missing_ops'])}, {', '.join(found['models'])}; "
        f"{found['reps']} alternating repetitions, median [min-max]; load average "
        f"{found['load_average']})",
        "",
        "| unset (a new user's shell) | exported as 0 | unset / 0 (medians) | unset / 0 "
        "(minima) | probe logs naming the TPU runtime |",
        "|---|---|---|---|---|",
        f"| {cell(found['prove_unset_s'])} | {cell(found['prove_autoload_0_s'])} | "
        f"{found['ratio_unset_over_0']:.2f}x | "
        f"{found.get('ratio_of_minima', float('nan')):.2f}x | "
        f"{len(found['probe_logs_naming_the_tpu_runtime'])} |",
        "",
        f"Within 20%: {ok(found['met']['within_20pct'])}; every proof confirmed: "
        f"{ok(found['met']['every_proof_confirmed'])}; no TPU runtime in any probe: "
        f"{ok(found['met']['no_tpu_runtime'])}.",
        "",
    ]


def ops_table(ops: dict) -> list[str]:
    """bench_ops.py: the census's cost per probe, and the prediction's time for 1,000 models."""
    if not ops:
        return []
    cell = lambda d: f"{d['median']:.2f} s [{d['min']:.2f}-{d['max']:.2f}]"  # noqa: E731
    lines = [
        f"### The operator census and the prediction ({ops['date']}, {ops['reps']} "
        "repetitions, median [min-max])",
        "",
        "| model | device | stages | stages with the census | census (fastest runs) | whole "
        "probe | share of the probe | operators / calls |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in ops["census"]:
        lines.append(
            f"| {c['model']} | {c['device']} | {cell(c['stages_s'])} | "
            f"{cell(c['stages_with_census_s'])} | {c['census_s']:+.3f} s | {c['probe_s']:.2f} "
            f"s | {100 * c['share_of_probe']:.1f}% | {c['ops']} / {c['calls']:,} |"
        )
    p = ops["prediction"]
    lines += [
        "",
        f"Census under 5% of the probe's time: {ok(ops['met']['census_under_5pct'])}.",
        "",
        f"Prediction for a sweep of {p['models']:,} models (synthetic census rows; "
        f"{p['predicted_fail']} predicted to fail, {p['plan_steps']} plan steps): "
        f"`model-support ops SWEEP --json` {cell(p['cli_s'])}; with `--on cpu` (a child "
        f"process asks the adapter) {cell(p['cli_on_cpu_s'])}; read + predict + plan in "
        f"process {cell(p['in_process_s'])}. In seconds: "
        f"{ok(ops['met']['prediction_in_seconds'])}.",
        "",
    ]
    return lines


def main() -> None:
    started = time.perf_counter()
    if sys.argv[1:] == ["--tables"]:  # rewrite bench/README.md from the results already there
        write_readme()
        return
    only = sys.argv[1:] or SCRIPTS
    for script in only:
        print(f"== {script}", flush=True)
        name, *args = script.split()  # a script, and its arguments where it runs more than one way
        subprocess.run([sys.executable, str(HERE / name), *args], check=True, cwd=HERE.parent)
    write_readme()
    print(f"bench done in {time.perf_counter() - started:.0f} s; tables written to bench/README.md")


if __name__ == "__main__":
    main()
