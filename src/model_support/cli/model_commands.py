"""One model of a sweep: debug, repro, localise; and the judge."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import UserError
from .common import sweep_model, sweep_model_arguments, user_errors


@click.command()
@sweep_model_arguments(
    "Debug in a variant's settings (e.g. compile+static): mode, cache and token count."
)
@click.option(
    "-p",
    "--parameter",
    "parameters",
    type=(str, str),
    multiple=True,
    metavar="NAME VALUE",
    help="Override a debug notebook parameter (e.g. -p device cpu, -p tolerance 0.5, -p host_ops "
    "aten::rsqrt).",
)
@user_errors
def debug(sweep_id, model, data_dir, variant, parameters):
    """Execute notebooks/debug.ipynb for MODEL (id or unique fragment) with SWEEP_ID's settings.

    Prints the executed notebook's path: open it in JupyterLab (make lab) to see where the model
    breaks (first failing module, generation step) and where it diverges from the CPU reference. A
    what-if sweep's host_ops (operators on the host's CPU kernels) hold in the notebook too, and are
    said.
    """
    import papermill
    import yaml

    from .. import debug as debug_mod

    # 0.5 -> float, as papermill's -y; an empty value stays empty (-p host_ops '': the stack as it
    # is)
    overrides = {
        name: yaml.safe_load(value) if value.strip() else value for name, value in parameters
    }
    model = sweep_model(data_dir, sweep_id, model)  # an exact name wins over fragments
    run = debug_mod.prepare_debug(data_dir, sweep_id, model, parameters=overrides, variant=variant)
    if run.stack_note:  # the notebook runs on the stack here: say so before it runs
        click.echo(run.stack_note)
    # a what-if run (host_ops), or a what-if sweep's model debugged without its operators on the
    # host
    if run.host_note:
        click.echo(run.host_note)
    try:
        path = debug_mod.execute_debug(run)
    except papermill.PapermillExecutionError as exc:
        said = next((line.strip() for line in str(exc.evalue).splitlines() if line.strip()), "")
        click.echo(
            f"debug notebook stopped at a cell error: {exc.ename}" + (f": {said}" if said else "")
        )
        click.echo(f"debug notebook: {run.out}")
        raise SystemExit(1) from None
    click.echo(f"debug notebook: {path}")
    result = debug_mod.debug_result_from_notebook(path)
    click.echo(debug_mod.summary_text(result))
    # the conclusion above is a what-if run's: said where it is read
    if debug_mod.hosting.sentence(result):
        click.echo(f"host ops:   {debug_mod.hosting.sentence(result)}")
    if run.stack_note:  # the conclusion above is this stack's: said again where it is read
        click.echo(
            f"stack:      this environment's, not the one sweep {sweep_id} ran on (see the "
            "first line)"
        )


@click.command()
@sweep_model_arguments("The row of a variant of the sweep's matrix (e.g. compile+static).")
@user_errors
def repro(sweep_id, model, data_dir, variant):
    """Print the standalone script that reproduces MODEL's probe (id or unique fragment) in
    SWEEP_ID.

    It runs with plain python (`model-support repro S M > run.py; python run.py`), imports nothing
    of this package, and prints the probe's verdict and token ids as one JSON line.
    """
    from ..probe import probe_params
    from ..probe import repro as repro_mod

    if variant is not None:
        variant = probe_params.variant(probe_params.parse_variant(variant))
    model_id = sweep_model(data_dir, sweep_id, model)
    click.echo(repro_mod.script_for(data_dir, sweep_id, model_id, variant), nl=False)


@click.command()
@sweep_model_arguments(
    "Localise the row of a variant of the sweep's matrix (a compiled one runs eagerly)."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (operator null when none is wrong).",
)
@user_errors
def localise(sweep_id, model, data_dir, variant, as_json):
    """Name the first aten operator whose output on SWEEP_ID's device is wrong for MODEL (id or
    unique fragment).

    The run is replayed on the device (this environment's stack): the prompt's forward, then the
    record's own tokens one decode step at a time through the KV cache, up to where the run first
    went wrong (or the long text's first disagreement); each operator is replayed on the CPU from
    the device's own inputs, and the first wrong one is stored beside the record
    (sweeps/<id>/localised/) with a one-operator script that exits 1 while the stack gets it wrong.
    Then the run goes again with it on the host, judged as `ops --prove` judges: confirmed when its
    output then matches the CPU reference, else the next wrong operator joins it (up to 3).
    """
    import json

    from ..debug import localise as localise_mod
    from ..debug.localise_words import answer_lines

    result = localise_mod.localise(
        data_dir, sweep_id, sweep_model(data_dir, sweep_id, model), variant
    )
    if as_json:
        click.echo(json.dumps(result))
        return
    for line in answer_lines(result):
        click.echo(line)


@click.command()
@click.argument("text", required=False)
@click.option(
    "--prompt", default="", help="The prompt TEXT answers (the judge scores TEXT given it)."
)
@click.option(
    "--jsonl",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    metavar="FILE",
    help='Score every line {"prompt": ..., "text": ...} of FILE instead of TEXT.',
)
@click.option(
    "--judge-model",
    default="",
    metavar="MODEL",
    help="Folder or Hub id of the judge (default: data/models/SmolLM2-135M-Instruct when built, "
    "else its Hub id).",
)
@user_errors
def judge(text, prompt, jsonl, judge_model):
    """Score TEXT (or each line of --jsonl FILE) for fluency with the probe's judge: one JSON
    line each, with fluent, fluency_score (mean log-probability per token, nats), repeated (share
    of repeated tokens) and note. The judge model loads once."""
    import json

    from ..probe import judge as judge_mod

    if (text is None) == (jsonl is None):
        raise UserError(
            "Give either TEXT or --jsonl FILE, not both (model-support judge --prompt P TEXT)."
        )
    if jsonl is not None and prompt:
        raise UserError(
            '--prompt goes with TEXT; in --jsonl FILE each line carries its own "prompt".'
        )
    items = judge_mod.read_jsonl(jsonl) if jsonl is not None else [{"prompt": prompt, "text": text}]
    scorer = judge_mod.load_for_command(judge_model)
    for item in items:
        found = scorer.score(item.get("prompt", ""), item["text"])
        click.echo(json.dumps({key: found[key] for key in judge_mod.SCORE_KEYS}))
