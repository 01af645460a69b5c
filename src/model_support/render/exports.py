"""A sweep's support matrix in the formats other tools read: JUnit XML for CI systems, Markdown for
a README or a pull-request comment, CSV and JSON for anything else (``model-support export``).

Read from the dataset alone (the ``results`` and ``excluded`` configs): a dataset pulled from the
Hub, with no ``sweeps/`` folder, exports the same. One row per model and variant: its verdict,
whether a PASS is right (numerics or fluency, the report's words, and the measure that judged it:
``check_measure``), tokens per second, the stack it ran on (torch, the device backend that ran as
its adapter named it, transformers), the command that reproduces it (``repro.command``) and where
its notebook and log are.
"""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl

from .. import analysis
from ..analysis.frames import BACKEND, backend_col, variant_col
from ..errors import UserError
from ..probe import repro, reproduce
from ..record import schema, store

FORMATS = ("markdown", "csv", "json", "junit")
#: The columns of every format, in order.
COLUMNS = (
    "model_id",
    "variant",
    "status",
    "check",
    "check_measure",
    "suspect",
    "failure_stage",
    "attribution",
    "failure_signature",
    "error_message",
    "tokens_per_s",
    "tokens_per_s_source",
    "decode_tokens_per_s",
    "device_type",
    "torch",
    BACKEND,
    "transformers",
    "repro",
    "notebook_url",
    "log_url",
    "duration_s",
)


def export_rows(data_dir: Path | str, sweep_id: str) -> list[dict]:
    """The sweep's rows (models excluded before or by their probe included, status ``excluded``),
    sorted by model and variant; one sentence when the dataset has none of the sweep."""
    data_dir = Path(data_dir)
    wanted = [
        "model_id",
        "variant",
        "status",
        "failure_stage",
        "attribution",
        "failure_signature",
        "error_message",
        "decode_tokens_per_s",
        "perf_tokens_per_s",
        "perf_tokens_out",
        "perf_note",
        "device_type",
        "versions",
        "backend_versions",
        "notebook_url",
        "log_url",
        "numerics",
        "numerics_measure",
        "fluent",
        "exclusion_reason",
        "duration_s",
    ]
    has_repro = (pl.col("repro_sha256").is_not_null() | pl.col("repro_script").is_not_null()).alias(
        "has_repro"
    )
    frames = [
        store.scan(data_dir, config)
        .filter(pl.col("sweep_id") == sweep_id)
        .select(*wanted, has_repro)
        .collect()
        for config in store.CONFIGS
    ]
    rows = pl.concat(frames, how="vertical_relaxed")
    # its definition, or a pulled sweep's rows, say so
    if store.what_if_setting(Path(data_dir), sweep_id):
        raise UserError(
            f"Sweep {sweep_id} is a what-if sweep (operators on the host): its rows are no "
            "verdicts of the stack, so no export lists them; they are the dataset's what_if "
            "config."
        )
    if rows.height == 0:
        raise UserError(
            f"The dataset in {data_dir} has no rows of sweep {sweep_id!r}; `model-support "
            f"aggregate {sweep_id}` writes them from its records."
        )
    rows = rows.with_columns(
        variant_col(),
        analysis.pass_check_col().alias("check"),
        analysis.check_measure_col(),
        backend_col(),
    ).sort("model_id", "variant")
    out = []
    for r in rows.iter_rows(named=True):
        versions = r["versions"] or {}
        excluded = bool(r["exclusion_reason"])
        out.append(
            {
                "model_id": r["model_id"],
                "variant": r["variant"],
                "status": "excluded" if excluded else r["status"],
                "check": r["check"],
                "check_measure": r["check_measure"],
                "suspect": r["check"] in analysis.SUSPECT_CHECKS,
                "failure_stage": r["failure_stage"],
                "attribution": r["attribution"],
                "failure_signature": r["failure_signature"],
                "error_message": r["exclusion_reason"] if excluded else r["error_message"],
                **speed(r),
                "decode_tokens_per_s": r["decode_tokens_per_s"],
                "device_type": r["device_type"],
                "torch": versions.get("torch"),
                # the backend that ran, as its adapter named it: none on the CPU
                BACKEND: r[BACKEND],
                "transformers": versions.get("transformers"),
                "repro": repro.command(sweep_id, r["model_id"], r["variant"], data_dir)
                if r["has_repro"] and not excluded
                else None,
                "notebook_url": r["notebook_url"],
                "log_url": r["log_url"],
                "duration_s": r["duration_s"],
            }
        )
    return out


def speed(row: dict) -> dict:
    """The speed a row's export shows, and its source: the perf phase's tokens/s (the median of
    its timed repeats) where it ran, else the verdict's own generation (its 8 tokens after the
    first, on the host's wall clock: a figure that includes the first calls and says so)."""
    if row.get("perf_tokens_per_s") is not None:
        tokens = row.get("perf_tokens_out")
        return {
            "tokens_per_s": row["perf_tokens_per_s"],
            "tokens_per_s_source": f"perf phase, median of repeats of {tokens} tokens"
            if tokens
            else "perf phase",
        }
    if row.get("decode_tokens_per_s") is not None:
        return {
            "tokens_per_s": row["decode_tokens_per_s"],
            "tokens_per_s_source": "the verdict's generation",
        }
    return {"tokens_per_s": None, "tokens_per_s_source": None}


def export(data_dir: Path | str, sweep_id: str, fmt: str, suspect_fails: bool = False) -> str:
    """The sweep in ``fmt`` (one of ``FORMATS``). JUnit: a suspect PASS is a failure with
    ``suspect_fails``, else a passing case that says why it is suspect."""
    if fmt not in FORMATS:
        raise UserError(f"Unknown export format {fmt!r}; use one of {', '.join(FORMATS)}.")
    rows = export_rows(data_dir, sweep_id)
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue()
    if fmt == "markdown":
        return markdown(sweep_id, rows)
    return junit(sweep_id, rows, suspect_fails)


def stack_text(row: dict) -> str:
    """The stack a row ran on, in words: its device, torch, the backend that ran (none on the
    CPU), transformers."""
    parts = [f"torch {row['torch']}" if row["torch"] else None, row[BACKEND]]
    parts.append(f"transformers {row['transformers']}" if row["transformers"] else None)
    return f"{row['device_type'] or '?'}: " + (", ".join(p for p in parts if p) or "unknown")


def check_text(row: dict) -> str | None:
    """A PASS's check with the measure that judged it, ``agrees (logit error)``: a ``match``
    judged by the KL alone (a row from before the logit error, ``KL + flip margin``) says less of
    a model with flat logits."""
    if row["check"] is None:
        return None
    return f"{row['check']} ({row['check_measure']})" if row.get("check_measure") else row["check"]


def _cell(value, limit: int | None = 160) -> str:
    """A Markdown table cell: no line breaks, no pipes; at most ``limit`` characters (None:
    whole, a command)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("|", "\\|").replace("\n", " ")[:limit]


def markdown(sweep_id: str, rows: list[dict]) -> str:
    """A heading, the verdict counts, then one table row per model and variant."""
    counts = {v: sum(r["status"] == v for r in rows) for v in (*schema.VERDICTS, "excluded")}
    suspect = sum(bool(r["suspect"]) for r in rows)
    lines = [
        f"## Sweep {sweep_id}",
        "",
        ", ".join(f"{k}: {n}" for k, n in counts.items()) + f"; suspect passes: {suspect}",
        "",
        "tokens/s: (perf) the perf phase's median of timed repeats; (verdict) the verdict's "
        "own 8-token generation. check: what a PASS's check says, and in brackets the measure "
        "that judged it (docs/numerics.md).",
        "backend: the device backend that ran, as its adapter named it (none: torch alone, "
        "the CPU). repro: the command that reproduces the row with plain python (its script "
        f"sets the backend's settings as the probe ran them; add `{reproduce.AS_FOUND_FLAG}` "
        "to its python command to run on the stack as found instead).",
        "",
        "| model | variant | verdict | check | stage | whose | signature | tokens/s | device "
        "| torch | backend | transformers | repro |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = (
            r["model_id"],
            r["variant"],
            r["status"],
            check_text(r),
            r["failure_stage"],
            r["attribution"],
            r["failure_signature"] or (r["error_message"] if r["status"] == "excluded" else None),
            f"{r['tokens_per_s']:.1f} "
            f"({'perf' if r['tokens_per_s_source'].startswith('perf') else 'verdict'})"
            if r["tokens_per_s"] is not None
            else None,
            r["device_type"],
            r["torch"],
            r[BACKEND],
            r["transformers"],
        )
        # whole: a command cut short runs nothing
        command = _cell(f"`{r['repro']}`", None) if r["repro"] else ""
        lines.append("| " + " | ".join(_cell(c) for c in cells) + f" | {command} |")
    return "\n".join(lines) + "\n"


def junit(sweep_id: str, rows: list[dict], suspect_fails: bool = False) -> str:
    """JUnit XML: one test suite (the sweep), one test case per model and variant (``classname``
    the sweep, ``name`` the model and its variant, unique); a FAIL is a ``failure`` with its
    message and signature, an excluded model ``skipped`` with its reason, a suspect PASS a
    failure with ``suspect_fails``, else a passing case whose ``system-out`` says why it is
    suspect."""
    suite = ET.Element("testsuite", name=sweep_id)
    failures = skipped = 0
    for r in rows:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=sweep_id,
            name=f"{r['model_id']} [{r['variant']}]",
            time=f"{r['duration_s'] or 0.0:.3f}",
        )
        if r["status"] == "excluded":
            ET.SubElement(case, "skipped", message=(r["error_message"] or "excluded")[:500])
            skipped += 1
        elif r["status"] != schema.PASS:
            failure = ET.SubElement(
                case,
                "failure",
                message=f"{r['status']} at {r['failure_stage'] or '?'}: "
                f"{(r['error_message'] or '')[:400]}",
                type=r["failure_signature"] or r["status"] or "",
            )
            failure.text = "\n".join(
                (
                    f"whose: {r['attribution'] or 'unknown'}",
                    f"stack: {stack_text(r)}",
                    f"repro: {r['repro'] or '-'}",
                )
            )
            failures += 1
        elif r["suspect"]:
            said = f"suspect PASS: {r['check']}"
            if suspect_fails:
                ET.SubElement(case, "failure", message=said, type="suspect PASS")
                failures += 1
            else:
                ET.SubElement(case, "system-out").text = said
    suite.set("tests", str(len(rows)))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    suites = ET.Element("testsuites", name="model-support")
    suites.append(suite)
    ET.indent(suites)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
    )
