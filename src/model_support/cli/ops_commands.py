"""The operators a sweep's models need, the porting plan, and its proof (docs/ops.md)."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from ..errors import UserError
from .common import data_dir_option, user_errors


@click.command()
@click.argument("sweep_id")
@click.option(
    "--on",
    "on",
    default=None,
    metavar="DEVICE",
    help="Predict on this machine's DEVICE stack (cpu, cuda, tpu, ...) instead of the sweep's own.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan and the predictions as JSON.")
@click.option(
    "--prove",
    is_flag=True,
    help="Run each step's operators (cumulatively) on the host over the models it unlocks (what-if "
    "sweeps), and say whether running confirms it.",
)
@click.option(
    "--complete",
    is_flag=True,
    help="First run the models a missing operator stopped with every missing operator on the host "
    "(host_ops: missing), so their census lists everything the stack lacks.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="What-if probes at once (default: the sweep's).",
)
@click.option(
    "--executor",
    type=click.Choice(["local", "ray"]),
    default=None,
    help="Where what-if probes run (default: the sweep's).",
)
@data_dir_option
@user_errors
def ops(sweep_id, on, as_json, prove, complete, workers, executor, data_dir):
    """The operators SWEEP_ID's models need: each model's verdict predicted from the census alone
    (no model runs), and the porting plan (missing operators, the one that unlocks the most
    models first); with --prove, each step run with its operators on the host (docs/ops.md). A
    what-if sweep has no plan of its own: one sentence says what it is and where its answers are
    (--json: that sentence in an object), exit status 0."""
    import json

    from .. import analysis
    from .. import ops as ops_mod
    from ..ops.plan import plan_json, step_proofs
    from ..ops.prove import last_proof, what_if_words
    from ..record import store
    from ..render.ops import ops_text

    sweeps = analysis.sweep_index(Path(data_dir), cache_dir=Path(data_dir) / analysis.SWEEP_CACHE)
    analysis.require_sweep(sweeps, sweep_id)  # an unknown sweep: one sentence, with the known ones
    host_ops = store.what_if_setting(Path(data_dir), sweep_id)
    # no plan of its own: what it is and where its answers are, said (a refusal only of --prove)
    if host_ops:
        said = what_if_words(Path(data_dir), sweep_id, host_ops)
        if prove or complete:
            raise UserError(
                f"{said['said'].rstrip('.')}; --prove and --complete run a plan of the stack's "
                "sweep."
            )
        click.echo(json.dumps(said, indent=1) if as_json else said["said"])
        return
    if (prove or complete) and on:
        raise UserError(
            "--prove and --complete run the sweep's own stack; --on predicts another one: use "
            "one of them."
        )
    if prove or complete:  # each step said as it ends (on stderr with --json: it prints JSON alone)
        from ..workflows import what_if

        what_if(
            data_dir,
            sweep_id,
            prove=prove,
            complete=complete,
            workers=workers,
            executor=executor,
            say=functools.partial(click.echo, err=as_json),
        )
    models = ops_mod.sweep_models(data_dir, sweep_id)
    coverage = ops_mod.stack_coverage(on, ops_mod.coverage.census_ops(models)) if on else None
    ops_mod.predict(models, coverage)
    steps = ops_mod.porting_plan(models)
    proofs = (
        None
        if on
        else step_proofs(
            models, steps, ops_mod.proof.read(data_dir, sweep_id).get("unhostable") or {}
        )
    )
    configured = None
    if on:  # the stack predicted for is the backend as configured here: part of the answer
        from ..probe.devices.registry import adapter_class

        configured = adapter_class(on).configuration()
    proven = [] if on else last_proof(data_dir, sweep_id, models, steps)
    if as_json:
        answer = {
            **plan_json(models, steps, proofs),
            "on": on,
            "configuration": configured,
            "proof": proven,
        }
        click.echo(json.dumps(answer, indent=1))
    else:
        click.echo(ops_text(models, steps, on, proofs=proofs, proven=proven))
        if on:
            said = (
                "; ".join(f"{k}={v!r}" for k, v in configured.items()) if configured else "none set"
            )
            click.echo(f"predicted for {on} as this environment configures its backend: {said}")
