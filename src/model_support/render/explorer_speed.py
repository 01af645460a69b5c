"""The explorer's speed history: each timed PASS's tokens/s, its spread over repeats and its TPOT,
per sweep.

Why a code and not JSON numbers: the history is run-length encoded by outcome, but a speed differs
on every sweep, and a real history times every PASS (100 sweeps x 10,000 models: ~700,000 timed
runs). As JSON numbers ("12.3,4.37,21.9,") that is ~8 MB on a page whose target is 10 MB in all; as
codes it is 6 characters a run.

A number is kept to 3 significant figures (what the panel shows) and written as two characters of
``ALPHABET`` (base 90: printable ASCII without ``"``, ``\\``, ``<``, so nothing needs escaping in
JSON or in a ``<script>``): code 0 is "none", 1 is zero, and ``2 + (e - LOW) * 900 + (m - 100)`` is
``m * 10**(e - 2)`` for a mantissa m of 100..999 and a decade e of ``LOW``..``HIGH`` (0.01 to
999,000; beyond, clipped to the nearest end). A run is three numbers (tokens/s median, its repeats'
spread ``(max - min) / median`` in per cent, TPOT in ms), an entry (model and variant) the runs of
consecutive sweeps from its first timed sweep to its last, a sweep in between that was not timed
written as one ``GAP`` (``!``, outside the alphabet; its verdict says why: a failure, or a PASS not
timed). 100 sweeps x 10,000 models, 70% of the runs timed at random (the worst case for gaps): ~6 MB
with a gap as wide as a run, 4.6 MB with one character; 700,000 runs encode in about a second.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..analysis.frames import variant_col
from ..record import schema, store

ALPHABET = "".join(c for c in map(chr, range(35, 127)) if c not in '\\<"')
GAP = "!"
BASE = len(ALPHABET)
LOW, HIGH = -2, 5
#: The numbers of a timed run, in the order they are written (the page reads them so).
FIELDS = ("tokens_per_s", "spread_pct", "tpot_ms")
WIDTH = 2 * len(FIELDS)
assert BASE == 90 and 2 + (HIGH - LOW + 1) * 900 <= BASE * BASE


def page_data(data_dir: Path, sweeps: pl.DataFrame, position: dict[tuple[str, str], int]) -> dict:
    """What the page reads: the alphabet, the gap, the lowest decade, and [entry, first sweep,
    codes] per timed entry (``position``: each (model_id, variant)'s entry; ``sweeps``: the
    page's sweeps, in order)."""
    rows = speed_rows(data_dir, sweeps)
    return {
        "alphabet": ALPHABET,
        "gap": GAP,
        "low": LOW,
        "entries": [
            [position[(m, v)], first, codes]
            for m, v, first, codes in rows.iter_rows()
            if (m, v) in position
        ],
    }


def speed_rows(data_dir: Path, sweeps: pl.DataFrame) -> pl.DataFrame:
    """model_id, variant, first (the sweep position of its first timed run) and codes, per timed
    entry."""
    order = sweeps.lazy().with_row_index("s").select("sweep_id", pl.col("s").cast(pl.Int64))
    repeats = pl.col("perf_tokens_per_s_repeats")
    spread = (repeats.list.max() - repeats.list.min()) / repeats.list.median() * 100
    timed = (
        store.scan(data_dir, "results")
        .filter((pl.col("status") == schema.PASS) & pl.col("perf_tokens_per_s").is_not_null())
        .select(
            "model_id",
            variant_col(),
            "sweep_id",
            "perf_tokens_per_s",
            spread.alias("spread"),
            "tpot_s",
        )
        .join(order, on="sweep_id", how="inner")
    )
    return encode(timed).collect()


def encode(timed: pl.LazyFrame) -> pl.LazyFrame:
    """``speed_rows`` from the timed PASS rows: model_id, variant, s (sweep position),
    perf_tokens_per_s, spread (in %) and tpot_s; one per (model_id, variant, s) is kept."""
    runs = (
        timed.unique(["model_id", "variant", "s"], keep="first")
        .sort("model_id", "variant", "s")
        .with_columns(
            pl.concat_str(
                code(pl.col("perf_tokens_per_s")),
                code(pl.col("spread")),
                code(pl.col("tpot_s") * 1000),
            ).alias("run"),
            (pl.col("s") - pl.col("s").shift(1).over("model_id", "variant") - 1)
            .fill_null(0)
            .alias("gap"),
        )
    )
    return (
        runs.with_columns(pl.col("run").str.pad_start(WIDTH + pl.col("gap"), GAP))
        .group_by("model_id", "variant", maintain_order=True)
        .agg(pl.col("s").first().alias("first"), pl.col("run").str.join("").alias("codes"))
    )


def code(value: pl.Expr) -> pl.Expr:
    """A number's two characters (see the module docstring): null "none", zero (or less) zero."""
    e = value.log10().floor().clip(LOW, HIGH)
    m = (value / pl.lit(10.0).pow(e - 2)).round()
    carry = m >= 1000  # 999.6 rounds to 1000: the next decade's 100
    e, m = pl.when(carry).then(e + 1).otherwise(e), pl.when(carry).then(m / 10).otherwise(m)
    over = e > HIGH
    e, m = (
        pl.when(over).then(HIGH).otherwise(e),
        pl.when(over).then(999).otherwise(m.clip(100, 999)),
    )
    n = (
        pl.when(value.is_null() | value.is_nan())
        .then(0)
        .when(value <= 0)
        .then(1)
        .otherwise(2 + (e - LOW) * 900 + (m - 100))
        .cast(pl.Int64)
    )
    digits = dict(enumerate(ALPHABET))
    return pl.concat_str(
        (n // BASE).replace_strict(digits, return_dtype=pl.String),
        (n % BASE).replace_strict(digits, return_dtype=pl.String),
    )


def decode(codes: str) -> list[tuple[float | None, ...] | None]:
    """Each sweep's numbers (``FIELDS``), None for a gap: what the page's ``speedOf`` reads, for
    tests and readers in Python."""
    out: list[tuple[float | None, ...] | None] = []
    at = 0
    while at < len(codes):
        if codes[at] == GAP:
            out.append(None)
            at += 1
            continue
        out.append(tuple(number(codes[k : k + 2]) for k in range(at, at + WIDTH, 2)))
        at += WIDTH
    return out


def number(two: str) -> float | None:
    """The number two characters stand for (the page's ``speedNumber``)."""
    n = ALPHABET.index(two[0]) * BASE + ALPHABET.index(two[1])
    if n < 2:
        return None if n == 0 else 0.0
    e, m = (n - 2) // 900 + LOW, 100 + (n - 2) % 900
    return m * 10 ** (e - 2) if e >= 2 else m / 10 ** (2 - e)
