"""The report's "What if" section: the porting plan's steps as running them with their operators
on the host says (``model-support ops SWEEP --prove``: confirmed, not confirmed with why, or
predicted only), the last proof as it ran, and the models that run with operators on the host
(which, and their calls per token), from ``analysis.ops_tables`` (ops_proof, ops_proof_runs,
ops_host). None of it is a verdict of the stack's: the what-if runs are kept apart (the
``what_if`` config)."""

from __future__ import annotations

import html

import polars as pl

from .html import table_html


def what_if_html(tables: dict[str, pl.DataFrame], sweep_id: str) -> str:
    """The section's body; "" for a sweep with neither a plan step nor a what-if run (the section
    is left out)."""
    plan, runs, host = tables.get("ops_proof"), tables.get("ops_proof_runs"), tables.get("ops_host")
    if (
        plan is None
        or runs is None
        or host is None
        or (plan.is_empty() and runs.is_empty() and host.is_empty())
    ):
        return ""
    confirmed = plan.filter(pl.col("proof") == "confirmed").height
    command = html.escape(f"model-support ops {sweep_id} --prove")
    if runs.is_empty() and host.is_empty():
        lead = (
            f'<p class="ms-note">No step of the plan has been run on the host yet: <code>{command}</code> runs each '
            "step's operators, with the earlier steps', on the host of the sweep's device over the models the step "
            "unlocks, and says whether they then PASS and agree with the CPU reference.</p>"
        )
    else:
        lead = (
            f'<p class="ms-lead"><b>{confirmed} of {plan.height} step{"s" if plan.height != 1 else ""} confirmed by '
            f"running</b> (<code>{command}</code>): a step is confirmed when every model it is predicted to unlock "
            "PASSes with its operators and the earlier steps' on the host and agrees with the CPU reference.</p>"
        )
    parts = [
        lead,
        "<h3>The plan's steps, confirmed or predicted</h3>",
        table_html(plan, max_rows=100, empty="none"),
    ]
    if not runs.is_empty():
        parts += ["<h3>The last proof, as it ran</h3>", table_html(runs, max_rows=100)]
    if not host.is_empty():
        parts += [
            "<h3>Models with operators on the host</h3>",
            '<p class="ms-note">What their what-if runs said; the verdict of the stack (<i>recorded</i>) is '
            "unchanged.</p>",
            table_html(host, max_rows=200),
        ]
    return "".join(parts)
