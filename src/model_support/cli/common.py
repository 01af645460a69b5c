"""What every command shares: ``--data-dir``, sweep ids as users give them, one sentence for bad
input.

Bad input (any ``UserError``: a params file, a flag, an unknown sweep) ends in one sentence on
stderr and exit status 2, never a bare stack trace. ``--data-dir`` is one shared option, also read
from ``$MODEL_SUPPORT_DATA_DIR``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import click
from click.core import ParameterSource

from ..errors import Interrupted, StorageFull, UserError
from ..paths import DATA_DIR_VAR

#: The commands that create the data folder when it is missing (a new sweep writes one); every other
#: command, and ``sweep --resume``, reads one.
CREATES_DATA_DIR = ("sweep", "nightly")
#: The arguments that name a sweep: each may be given as ``latest``, ``latest:NAME`` or a unique
#: prefix.
SWEEP_ARGUMENTS = ("sweep_id", "sweep_a", "sweep_b", "resume", "baseline")


def debug_asked() -> bool:
    """``model-support --debug``: show the traceback behind an error, not only its sentence."""
    return bool(click.get_current_context().find_root().params.get("debug"))


def data_dir_words(ctx, data_dir: Path) -> str:
    """The data folder as the user gave it: ``--data-dir X``, ``$MODEL_SUPPORT_DATA_DIR (X)`` or the
    default."""
    source = ctx.get_parameter_source("data_dir")
    if source == ParameterSource.ENVIRONMENT:
        return f"${DATA_DIR_VAR} ({data_dir})"
    if source == ParameterSource.DEFAULT:
        return f"the default data folder {data_dir} (in {Path.cwd()})"
    return f"--data-dir {data_dir}"


def _require_data_dir(kwargs: dict) -> None:
    """A data folder that does not exist, refused by every command that reads one (all but a new
    sweep: ``CREATES_DATA_DIR``) in one sentence naming where it came from, before the command
    runs; a command naming a sweep says that sweep does not exist, and why."""
    data_dir = kwargs.get("data_dir")
    ctx = click.get_current_context()
    if data_dir is None or Path(data_dir).exists():
        return
    if ctx.command.name in CREATES_DATA_DIR and not kwargs.get("resume"):
        return
    if ctx.command.name == "bisect" and kwargs.get("clean"):  # empties the environment cache only
        return
    named = data_dir_words(ctx, Path(data_dir))
    sweep = next((kwargs[name] for name in SWEEP_ARGUMENTS if kwargs.get(name)), None)
    if sweep and (sweep == "latest" or sweep.startswith("latest:")):  # what it was asked for, first
        named = f"There is no {sweep!r} sweep, since {named}"
    elif sweep:
        named = f"Sweep {sweep!r} does not exist, since {named}"
    raise UserError(
        f"{named} does not exist: give the data folder a sweep wrote (the one holding "
        "sweeps/), or run `model-support sweep` first, which creates it."
    )


def _finish_interrupted(ctx, param, data_dir: Path) -> Path:
    """Every command reading or writing the data folder first refuses one that is a file, then
    finishes a change of its dataset that a stopped process left half-done
    (``store.finish_interrupted``), one line each; a missing one is ``_require_data_dir``'s (it
    needs to know the command's arguments)."""
    # the store's import (pyarrow) only for a command that has a data folder
    from ..record import store

    given = data_dir is not None and not ctx.resilient_parsing
    if given and Path(data_dir).exists() and not Path(data_dir).is_dir():
        raise click.UsageError(
            f"{data_dir_words(ctx, Path(data_dir))} is a file, not a folder: give the data "
            "folder, the one holding sweeps/ (e.g. --data-dir data).",
            ctx,
        )
    if (
        data_dir is not None
        and (Path(data_dir) / "sweeps").is_dir()
        and store.interrupted(data_dir)
    ):
        try:
            for line in store.finish_interrupted(data_dir):
                click.echo(line, err=True)
        except (UserError, OSError) as exc:
            click.echo(f"Could not finish an interrupted change in {data_dir}: {exc}", err=True)
    return data_dir


def data_dir_option(command):
    """The shared ``--data-dir`` option."""
    return click.option(
        "--data-dir",
        type=click.Path(path_type=Path),
        envvar=DATA_DIR_VAR,
        default=Path("data"),
        show_default=True,
        show_envvar=True,
        callback=_finish_interrupted,
        help="Data folder (sweeps, Parquet dataset, reports).",
    )(command)


def _resolve_sweep_ids(kwargs: dict) -> None:
    """Each sweep argument as the id it means (``store.resolve_sweep_id``), in place."""
    if "data_dir" not in kwargs:
        return
    from ..record import store  # as in _finish_interrupted

    for name in SWEEP_ARGUMENTS:
        if kwargs.get(name):
            kwargs[name] = store.resolve_sweep_id(kwargs["data_dir"], kwargs[name])


def user_errors(command):
    """A UserError becomes click's usage error (one sentence, exit status 2); a StorageFull (the
    data folder could not be written) or an Interrupted (a sweep stopped early) one sentence with
    exit status
    1. ``--debug`` shows the traceback."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            _require_data_dir(kwargs)
            _resolve_sweep_ids(kwargs)
            return command(*args, **kwargs)
        except (UserError, StorageFull, Interrupted) as exc:
            if debug_asked():
                raise
            if isinstance(exc, (StorageFull, Interrupted)):
                raise click.ClickException(str(exc)) from None
            raise click.UsageError(str(exc)) from None

    return wrapper


def stop_on_sigterm(signum, frame):
    """SIGTERM stops a sweep as Ctrl-C does, in one sentence."""
    raise KeyboardInterrupt


def sweep_model(data_dir: Path, sweep_id: str, model: str) -> str:
    """The model id of sweep ``sweep_id`` that MODEL names (``model_ids.resolve``: an exact name
    wins over fragments), for debug, repro and localise; one sentence when it names none or
    several."""
    from ..probe.model_ids import resolve
    from ..record import store

    if not (store.sweep_dir(data_dir, sweep_id) / "sweep.json").exists():  # pulled without sweeps/
        ids = store.model_ids_of_rows(data_dir, sweep_id)
        if ids:
            return resolve(ids, model, f"sweep {sweep_id}")
    meta = store.read_sweep(data_dir, sweep_id)
    return resolve([entry.model_id for entry in meta.models], model, f"sweep {meta.sweep_id}")


def sweep_model_arguments(variant_help: str):
    """SWEEP_ID MODEL, --data-dir and --variant: a command about one row of a sweep (debug,
    repro)."""

    def apply(command):
        for decorate in reversed(
            (
                click.argument("sweep_id"),
                click.argument("model"),
                data_dir_option,
                click.option("--variant", default=None, metavar="VARIANT", help=variant_help),
            )
        ):
            command = decorate(command)
        return command

    return apply
