"""What every analysis query shares: the frame helpers, the metric names and the buckets.

Every query takes the ``results`` rows of all sweeps (``store.scan(data_dir, "results")``, a
LazyFrame; a DataFrame is accepted too) and returns a small ``pl.DataFrame``. Queries are lazy and
select only the columns they need, so the same functions serve one sweep of ten models and a
history of a million rows. Columns that older files lack (``schema.LATER_FIELDS``) read as null and
give null statistics, never an error.
"""

from __future__ import annotations

import polars as pl

from ..probe import probe_params
from ..record import schema, store

Frame = pl.LazyFrame | pl.DataFrame


#: Model size buckets by ``num_params``, in display order.
SIZE_BUCKETS = ("<10M", "10M-1B", "1-10B", ">10B", "unknown")
#: Outcomes of the CPU reference check.
REFERENCE_OUTCOMES = ("match", "mismatch", "not run")
#: The stack component that is the device backend: the packages and runtime its adapter declares
#: (``backend_col``).
BACKEND = "backend"
#: Stack components the history is broken down by (``version``): torch, the device backend,
#: transformers.
VERSION_COMPONENTS = ("torch", BACKEND, "transformers")
#: The columns ``version`` reads (a query selecting columns selects these for it).
VERSION_COLUMNS = ("versions", "device_type", "backend_versions")
TIMING_METRICS = ("load_s", "first_token_s", "decode_tokens_per_s")
MEMORY_METRICS = ("peak_host_mem_mb", "peak_device_mem_mb")
TOKEN_METRICS = ("tokens_in", "tokens_out", "image_tokens")
#: The tasks a probe runs, in display order; a null ``task`` (files before the column) reads as
#: text-generation.
TASKS = (schema.TEXT_GENERATION, schema.IMAGE_TEXT_TO_TEXT)
#: How a (model, variant)'s outcome changed between a baseline sweep and a later one, in display
#: order: what a porting team acts on first. A model newly failing is split by whose failure it is
#: (``attribution``): the stack's (the CPU reference passes), everywhere (the model's, or both: the
#: reference fails too, usually a transformers or checkpoint change), or unknown (no reference
#: rerun: plain "newly failing").
NEWLY_BROKEN_BY_STACK = "newly broken by the stack"
NEWLY_FAILING = "newly failing"
NEWLY_FAILING_EVERYWHERE = "newly failing everywhere"
#: A run that passes now with a suspect check (``SUSPECT_CHECKS``) and was not a suspect PASS
#: before; and back.
NEWLY_SUSPECT = "newly suspect"
NO_LONGER_SUSPECT = "no longer suspect"
#: The gate's own words the diff says where the decision says more (``decision.relabel``); a summary
#: names them only when some run is one.
GATE_CHANGES = ("vanished", "not run", "flaky", "excluded", "dropped")
CHANGES = (
    NEWLY_BROKEN_BY_STACK,
    NEWLY_SUSPECT,
    NEWLY_FAILING,
    NEWLY_FAILING_EVERYWHERE,
    "vanished",
    "not run",
    "flaky",
    "newly passing",
    NO_LONGER_SUSPECT,
    "status changed",
    "signature changed",
    "added",
    "removed",
    "excluded",
    "dropped",
)
#: Whose failure it is, as the report counts it: ``schema.ATTRIBUTIONS`` plus a failure with none
#: recorded.
UNKNOWN_ATTRIBUTION = "unknown"
ATTRIBUTION_KINDS = (*schema.ATTRIBUTIONS, UNKNOWN_ATTRIBUTION)
ATTRIBUTION_KIND_HELP = {
    **schema.ATTRIBUTION_HELP,
    UNKNOWN_ATTRIBUTION: "no reference rerun: switched off, above the size or memory limit, a stage not rerun "
    "(download, runner), or a sweep before attribution",
}
#: Is a PASS right? What its check says (docs/numerics.md), suspect ones first: the reference's
#: verdict on its logits (``numerics``) where one ran, else the fluency judge's on its text;
#: "unchecked" when neither said anything (older sweeps, the reference and the judge both off). The
#: verdict stays PASS in every case.
DIVERGES = "diverges"
NOT_FLUENT = "no reference, not fluent"
TIES = "agrees within ties"
AGREES = "agrees"
FLUENT = "no reference, fluent"
UNCHECKED = "unchecked"
PASS_CHECKS = (DIVERGES, NOT_FLUENT, TIES, AGREES, FLUENT, UNCHECKED)
SUSPECT_CHECKS = (DIVERGES, NOT_FLUENT)
PASS_CHECK_HELP = {
    DIVERGES: "suspect: the device chose a token the reference does not consider close, its "
    "distribution differs beyond the bound, or its logits are not finite",
    NOT_FLUENT: "suspect: no reference could run (or it was too flat to judge), and the judge finds the "
    "text not fluent (or no visible text)",
    TIES: "the device computes what the reference computes, except flips where the reference's best "
    "tokens are within the margin (legitimate near-ties)",
    AGREES: "every step's top token is the reference's, and no step's distribution differs beyond the "
    "bound",
    FLUENT: "no reference could run (too big for the host, switched off) or it was too flat to judge; "
    "the judge finds the text fluent",
    UNCHECKED: "neither the reference nor the judge said anything (switched off, or a sweep before these "
    "checks)",
}
#: What judged a PASS's check (``check_measure_col``): the reference's ``numerics_measure``
#: (agreement.MEASURES: logit error, flip margin, KL, finite), what a row from before it was judged
#: by, or the fluency judge.
OLDER_MEASURE = "KL + flip margin"
JUDGE_MEASURE = "fluency judge"
TOO_FLAT_MEASURE = "fluency judge (reference too flat)"
#: ``numerics`` values that the reference judged (agreement.MATCH, TIES, DIVERGES); "too flat"
#: leaves it to the judge.
JUDGED_NUMERICS = ("match", "ties", "diverges")
#: A record's variant when it has none (sweeps without a matrix, and files that predate the column).
DEFAULT_VARIANT = schema.DEFAULT_VARIANT
SIGNATURE_CHANGES = ("appeared", "vanished")
#: Shown for a failure that has no signature (a record written before signatures existed).
NO_SIGNATURE = "(no signature)"

_DTYPES = store.polars_schema()


# --------------------------------------------------------------------------------------------
# helpers


def as_lazy(frame: Frame) -> pl.LazyFrame:
    return frame.lazy() if isinstance(frame, pl.DataFrame) else frame


def restricted_to(frame: Frame, columns) -> pl.LazyFrame:
    """``frame`` restricted to ``columns``; a column the frame lacks is added as typed nulls."""
    lf = as_lazy(frame)
    have = set(lf.collect_schema().names())
    exprs = [pl.col(c) if c in have else pl.lit(None, dtype=_DTYPES[c]).alias(c) for c in columns]
    return lf.select(exprs)


def sweep_rows(frame: Frame, sweep_id: str, columns) -> pl.LazyFrame:
    cols = list(dict.fromkeys(["sweep_id", *columns]))
    return restricted_to(frame, cols).filter(pl.col("sweep_id") == sweep_id)


def older_col(name: str) -> pl.Expr:
    """Column ``name``, a null read as what rows from before the field existed mean
    (``schema.OLDER_DEFAULTS``)."""
    return pl.col(name).fill_null(schema.OLDER_DEFAULTS[name]).alias(name)


def variant_col() -> pl.Expr:
    """``variant``, a null (an older file, a sweep without a matrix) read as ``DEFAULT_VARIANT``."""
    return older_col("variant")


def task_col() -> pl.Expr:
    """``task``, a null (a file that predates the column: every probe then ran text-generation)
    read so."""
    return pl.col("task").fill_null(schema.TEXT_GENERATION).alias("task")


def attribution_col() -> pl.Expr:
    """Whose failure a row is (one of ``ATTRIBUTION_KINDS``); null for a PASS."""
    failed = pl.col("status").ne_missing(schema.PASS)
    return (
        pl.when(failed)
        .then(pl.col("attribution").fill_null(UNKNOWN_ATTRIBUTION))
        .otherwise(None)
        .alias("attribution")
    )


def pass_check_col() -> pl.Expr:
    """What a PASS's check says (one of ``PASS_CHECKS``): the reference's ``numerics`` where it
    ran, else the judge's ``fluent``; null for a failure."""
    numerics, fluent = pl.col("numerics"), pl.col("fluent")
    return (
        pl.when(pl.col("status").ne_missing(schema.PASS))
        .then(None)
        .when(numerics == "diverges")
        .then(pl.lit(DIVERGES))
        .when(numerics == "ties")
        .then(pl.lit(TIES))
        .when(numerics == "match")
        .then(pl.lit(AGREES))
        .when(fluent.eq_missing(False))
        .then(pl.lit(NOT_FLUENT))
        .when(fluent.eq_missing(True))
        .then(pl.lit(FLUENT))
        .otherwise(pl.lit(UNCHECKED))
        .alias("pass_check")
    )


def check_step_col() -> pl.Expr:
    """Where a PASS's check says it diverges from the reference (``numerics_step``), for a
    diverging check only: a too flat reference also has a step (the first it could not judge),
    which is no divergence; named ``check_step``."""
    return pl.when(pass_check_col() == DIVERGES).then(pl.col("numerics_step")).alias("check_step")


def check_note_col() -> pl.Expr:
    """Why a PASS's check says what it says: the reference's note where it judged, else the
    judge's (after the reference's, where it ran but was too flat to judge)."""
    numerics = pl.col("numerics")
    return (
        pl.when(numerics.is_in(JUDGED_NUMERICS))
        .then(pl.col("numerics_note"))
        .when(numerics.is_not_null())
        .then(
            pl.concat_str(
                [pl.col("numerics_note"), pl.col("fluency_note")], separator="; ", ignore_nulls=True
            )
        )
        .otherwise(pl.coalesce(pl.col("fluency_note"), pl.col("numerics_note")))
        .alias("check_note")
    )


def check_measure_col() -> pl.Expr:
    """Which measure a PASS's check rests on (docs/numerics.md): where the reference judged, its
    ``numerics_measure`` (``logit error``: the scale-free measure judged every step, beside the
    KL and the flips; a diverging row's measure(s) that tripped), ``OLDER_MEASURE`` for a row
    from before that column; where the judge decided, ``JUDGE_MEASURE`` (``TOO_FLAT_MEASURE``
    when the reference ran but was too flat); null for a failure or an unchecked PASS. Why: a
    ``match`` judged by the KL alone says little of a model whose logits are flat."""
    numerics, fluent = pl.col("numerics"), pl.col("fluent")
    return (
        pl.when(pl.col("status").ne_missing(schema.PASS))
        .then(None)
        .when(numerics.is_in(JUDGED_NUMERICS))
        .then(pl.coalesce(pl.col("numerics_measure"), pl.lit(OLDER_MEASURE)))
        .when(fluent.is_not_null() & numerics.is_not_null())
        .then(pl.lit(TOO_FLAT_MEASURE))
        .when(fluent.is_not_null())
        .then(pl.lit(JUDGE_MEASURE))
        .otherwise(None)
        .cast(pl.String)
        .alias("check_measure")
    )


def variant_key(label: str) -> tuple:
    """Sort key of a variant label (``eager+dynamic``, ``compile+static+32t``): mode, cache, then
    new tokens, in ``probe_params`` order, so a grid reads eager before compile and dynamic
    before static; others last."""
    parts = (label or "").split("+")
    mode = (
        probe_params.MODES.index(parts[0])
        if parts[0] in probe_params.MODES
        else len(probe_params.MODES)
    )
    cache = parts[1] if len(parts) > 1 else ""
    cache_i = (
        probe_params.CACHES.index(cache)
        if cache in probe_params.CACHES
        else len(probe_params.CACHES)
    )
    rest = "+".join(parts[2:])
    tokens = (
        int(rest[:-1])
        if rest.endswith("t") and rest[:-1].isdigit()
        else (8 if not rest else 1 << 30)
    )
    return (mode, cache_i, tokens, label or "")


def sort_variants(labels) -> list[str]:
    return sorted({v for v in labels if v is not None}, key=variant_key)


def _passed() -> pl.Expr:
    return (pl.col("status") == schema.PASS).fill_null(False)


def rate_aggs() -> list[pl.Expr]:
    return [
        pl.len().cast(pl.Int64).alias("models"),
        _passed().sum().cast(pl.Int64).alias("passed"),
    ]


def with_rate(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf.with_columns(
        failed=pl.col("models") - pl.col("passed"),
        pass_rate=pl.when(pl.col("models") > 0).then(pl.col("passed") / pl.col("models")),
    )


def size_bucket(column: str = "num_params") -> pl.Expr:
    """``num_params`` -> one of ``SIZE_BUCKETS`` (an Enum, so it sorts in size order)."""
    n = pl.col(column)
    return (
        pl.when(n.is_null())
        .then(pl.lit("unknown"))
        .when(n < 10_000_000)
        .then(pl.lit("<10M"))
        .when(n < 1_000_000_000)
        .then(pl.lit("10M-1B"))
        .when(n < 10_000_000_000)
        .then(pl.lit("1-10B"))
        .otherwise(pl.lit(">10B"))
        .cast(pl.Enum(SIZE_BUCKETS))
        .alias("size_bucket")
    )


def describe(lf: pl.LazyFrame, metrics, stats) -> pl.LazyFrame:
    """One row per metric: ``count`` (non-null values) and each of ``stats`` as Float64."""
    funcs = {
        "mean": lambda c: c.mean(),
        "median": lambda c: c.median(),
        "p90": lambda c: c.quantile(0.9, interpolation="linear"),
        "min": lambda c: c.min(),
        "max": lambda c: c.max(),
        "total": lambda c: pl.when(c.count() > 0).then(c.sum()),
    }
    parts = []
    for metric in metrics:
        col = pl.col(metric).cast(pl.Float64)
        parts.append(
            lf.select(
                pl.lit(metric).alias("metric"),
                col.count().cast(pl.Int64).alias("count"),
                *[funcs[s](col).cast(pl.Float64).alias(s) for s in stats],
            )
        )
    return pl.concat(parts, how="vertical")


def version(component: str) -> pl.Expr:
    """A stack component of a row (one of ``VERSION_COMPONENTS``, or a field of ``versions``):
    the device backend is ``backend_col``, any other a field of its ``versions``. Reads
    ``VERSION_COLUMNS``."""
    return backend_col() if component == BACKEND else pl.col("versions").struct.field(component)


def backend_col() -> pl.Expr:
    """The device backend a row ran on, as one text (``BACKEND``): its ``backend_versions`` as
    its device's adapter declared them (``torch_tpu 0.2.0, libtpu 0.0.52``). A row from before
    that field reads, from its ``versions``, the packages its device's adapter declares that
    ``versions`` had a field for. Null where the backend is torch alone (the CPU) or unknown (an
    older row of a backend ``versions`` never named), never another build's."""
    older = [
        pl.when(pl.col("device_type") == device).then(
            pl.concat_str(
                [pl.format(f"{name} {{}}", version(name)) for name in packages],
                separator=", ",
                ignore_nulls=True,
            )
        )
        for device, packages in _older_backends().items()
    ]
    text = pl.coalesce(pl.col("backend_versions").list.join(", "), *older)
    return pl.when(text != "").then(text).alias(BACKEND)


def _older_backends() -> dict[str, tuple[str, ...]]:
    """Per device whose backend a row from before ``backend_versions`` can be read from its
    ``versions``: the packages its adapter declares that ``versions`` had a field for."""
    from ..probe.devices import registered

    fields = set(schema.Versions.__annotations__)
    found = {}
    for device, adapter in registered().items():
        kept = tuple(name for name in adapter.backend_packages if name in fields)
        if kept:
            found[device] = kept
    return found


def backend_settings_col() -> pl.Expr:
    """The device backend's settings a row ran with, as JSON (``backend_config``: its adapter's
    variables); a row from before that field, the settings its repro script sets
    (``repro_settings``' ``device_config``), null where neither says (no setting, or unknown)."""
    older = pl.col("repro_settings").str.json_path_match("$.device_config")
    return pl.coalesce(pl.col("backend_config"), older).alias("backend_settings")
