"""Agreement over a long real text: the check that reaches the positions the verdict's 8 tokens
never do.

Why: attention kernels tile keys in blocks of 128 or 512, sliding windows start at thousands, RoPE
scaling and the KV cache's growth act at long positions. The verdict generates 8 tokens (32 with
long generation) and tests none of them, so a kernel wrong from position 600 on leaves a PASS that
``numerics`` calls ``match``. Here a public-domain text shipped with the package (the opening of *A
Tale of Two Cities*, ``texts/two_cities.txt``) is fed through the model on the device with teacher
forcing, up to ``long_text_tokens`` (1,024) tokens or the model's positions, twice:

- as **one prefill** (one forward pass over the whole text: the prompt path);
- **token by token through the KV cache** (one forward pass per position, each reading the cache the
  earlier ones wrote: the decode path, the one a server runs for every generated token).

Each position's top token on the device is compared with the CPU reference's top 5 (teacher-forced
on the same text, one forward pass, float32 for a half-precision run as the verdict's reference):
top-1 agreement (the same top token; of the device's exactly tied best, the one the reference
prefers, as ``agreement`` does), top-5 agreement (the device's token among the reference's best 5:
tt-metal's and tt-xla's accuracy measure), and where it *diverges*: the device's token outside the
reference's top 5, or further below its best than the position's margin (a flip at a near-tie is
bf16's rounding, not a wrong kernel): ``numerics_margin`` nats, or
``agreement.DEFAULT_RELATIVE_MARGIN`` of the reference's logit spread at that position where that is
smaller, as the verdict's check has it. Agreement with the reference needs no labels and no model
that can do a task: a tiny model scores as well as a big one when its numbers are right.

The rate the gate reads (``long_text_rate``) is the lowest agreement within the margin (the
positions that do not diverge: the same top token, or a near-tie flip) over windows of ``WINDOW``
(128) positions, over both paths: a fault that starts late (position 600 of 1,024) is diluted by the
positions before it in a whole-text mean, and read at full strength in the windows after it; 128 is
the smallest tile attention kernels use. Near-tie flips do not lower it: they come and go with
bf16's rounding (two on SmolLM2's 128 positions), and a rate that moved with them would call noise a
regression.

The reference's top 5 per position is computed once per model revision, text, length and reference
dtype, and kept in the data folder (``reference_file``: ``long_text/<model>/<key>.json``, ~90 KB per
1,024 tokens, written atomically through ``fileio``); later sweeps read it and load no reference
model. A model's revision is its Hub commit (``revision_sha``), else a fingerprint of its folder's
files (``folder_fingerprint``: a local fixture rebuilt with new weights is another revision).

The device's half (``on_device``) runs in the probe's device phase after the perf phase, on the
model the stages kept; it returns what the host's half needs (the text's ids and each position's top
5 on the device, as JSON, ~160 KB per 1,024 tokens). The host's half (``check``) runs with the host
checks (``checks.check_pass``) and fills the record's ``RECORD_FIELDS``. Neither changes the
verdict: what stops either is ``long_text_note``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import inspect
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..fileio import atomic_write_text

if TYPE_CHECKING:
    from ..record.schema import Record

#: The text, shipped as package data (pyproject.toml's package-data): Charles Dickens, *A Tale of
#: Two Cities* (1859, public domain), Book the First, chapters I and II (17 KB; 4,171 tokens for
#: SmolLM2's tokenizer, so a tokenizer with a larger vocabulary still gives the 1,024 asked for).
TEXT_FILE = Path(__file__).resolve().parent / "texts" / "two_cities.txt"
TEXT_NAME = "two_cities"
#: The default length in tokens, and the least the setting takes (fewer positions say nothing a
#: verdict does not).
DEFAULT_TOKENS = 1024
MIN_TOKENS = 16
#: How many of the reference's best tokens are kept per position (top-5 agreement), and of the
#: device's (its ties).
TOP_K = 5
#: Positions per window of the gate's rate (``rate``); a last window shorter than half of it joins
#: the one before.
WINDOW = 128
#: How far a rate may fall before it says something (the gate against a baseline, ``tolerance``; a
#: proof, ``proven``): three positions of a 128-position window. Measured on SmolLM2 over 1,024
#: positions (bench/bench_long_text.py, results/long_text_rates.json): two healthy bf16 stacks read
#: 1.000, every matrix product off by half of bf16's epsilon 0.992 (one position beyond its margin),
#: a linear layer 2% wrong 0.953 (over 512).
TOLERANCE = 0.025
#: What the setting takes.
CHOICES = ("off", "on")
#: The data folder's subfolder of cached reference top-k files.
CACHE_FOLDER = "long_text"
#: The paths, in the order the note says them.
PATHS = ("prefill", "decode")

#: The record fields this check fills (``record.schema``: group numerics), all null when it did not
#: run.
RECORD_FIELDS = (
    "long_text_tokens",
    "long_text_text",
    "long_text_prefill_top1",
    "long_text_prefill_top5",
    "long_text_decode_top1",
    "long_text_decode_top5",
    "long_text_first_disagreement",
    "long_text_prefill_diverges_at",
    "long_text_decode_diverges_at",
    "long_text_rate",
    "long_text_device_s",
    "long_text_note",
)


def wanted(settings: dict) -> bool:
    """Whether the probe's settings ask for the check (``long_text`` on; true reads as on)."""
    return settings.get("long_text") in ("on", True)


def text() -> str:
    return TEXT_FILE.read_text(encoding="utf-8")


def text_id() -> str:
    """Which text, by name and content: two sweeps' rates compare only over the same text."""
    return f"{TEXT_NAME}:{hashlib.sha256(TEXT_FILE.read_bytes()).hexdigest()[:12]}"


def token_ids(tokenizer, tokens: int, positions: int | None) -> list[int]:
    """The text's first token ids as the tokenizer gives them (its special tokens included, as a
    server would add them): ``tokens`` of them, at most the model's ``positions``."""
    ids = list(tokenizer(text(), add_special_tokens=True)["input_ids"])
    limit = min(tokens, positions) if positions else tokens
    return ids[:limit]


# --------------------------------------------------------------------------------------------
# the device's half


def _cache_keyword(model) -> str:
    """The keyword a model's forward takes its KV cache by: ``cache`` (transformers 5.25), else
    the older ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _returned_cache(out):
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def run_paths(model, ids: list[int], device, synchronize=None) -> dict:
    """The text through ``model`` on ``device``, teacher-forced: one prefill over all of ``ids``,
    then one forward pass per position through the KV cache (the model's own, as its first
    forward makes it). Each position's ``TOP_K`` best token ids and logits on the device, moved
    to the host once per path (no sync per decode step), and each path's seconds after a sync."""
    import torch

    keyword = _cache_keyword(model)
    found: dict = {}
    with torch.inference_mode():
        # made inside inference mode: its slices are views a backend allows
        x = torch.tensor([ids], device=device)
        began = time.perf_counter()
        logits = model(input_ids=x, use_cache=False).logits[0]
        # in the logits' own dtype: no float copy of n x vocabulary
        values, top = logits.topk(TOP_K, dim=-1)
        found["prefill"] = {"ids": top.cpu().tolist(), "logits": values.float().cpu().tolist()}
        found["prefill_s"] = time.perf_counter() - began
        del logits, values, top
        began = time.perf_counter()
        cache, tops, vals = None, [], []
        for p in range(len(ids)):
            more: dict = {keyword: cache} if cache is not None else {}
            out = model(input_ids=x[:, p : p + 1], use_cache=True, **more)
            cache = _returned_cache(out)
            v, i = out.logits[0, -1].topk(TOP_K)
            tops.append(i)
            vals.append(v)
        found["decode"] = {
            "ids": torch.stack(tops).cpu().tolist(),
            "logits": torch.stack(vals).float().cpu().tolist(),
        }
        if synchronize:
            synchronize()
        found["decode_s"] = time.perf_counter() - began
    found["device_s"] = found["prefill_s"] + found["decode_s"]
    return found


def on_device(
    record: Record, settings: dict, result: dict, adapter, reference_skip: str | None = None
) -> dict | None:
    """The device's half, in the device phase after a PASS (``checks.long_text_on_device`` calls
    it with the CPU reference's limits): None when the setting is off; else what ``check`` needs
    (the text's ids, each path's top ``TOP_K`` per position, the device's seconds), or ``{"note":
    why}`` where it cannot run or the device raised (never a verdict). ``reference_skip``: why
    the CPU reference cannot run for this model; the device is then spared the text unless an
    earlier sweep's reference is already in the data folder."""
    if not wanted(settings):
        return None
    from . import probe_core

    model, tokenizer = result.get("model"), result.get("tokenizer")
    if model is None or tokenizer is None:
        return {"note": "not run: the stages kept no model after the verdict"}
    ids = token_ids(tokenizer, settings["long_text_tokens"], probe_core.positions_of(model))
    if len(ids) < MIN_TOKENS:
        return {
            "note": f"not run: the model holds {len(ids)} positions of the text, fewer than "
            f"{MIN_TOKENS}"
        }
    reference = reference_file(data_folder(record, settings), record, settings, ids)
    if reference_skip and not reference.is_file():
        return {"note": f"not run: no reference to compare with ({reference_skip}) and none cached"}
    sync = adapter.synchronize if adapter.type != "cpu" else None
    try:
        # compile mode: the forward is eager again by now
        with probe_core.execution_context(settings["mode"]):
            found = run_paths(model, ids, adapter.torch_device, sync)
    except Exception as exc:  # noqa: BLE001 the device failing on the text is said beside the PASS, not a verdict
        return {"note": f"the device raised on the long text: {type(exc).__name__}: {exc}"[:2000]}
    return {
        **found,
        "text": text_id(),
        "ids": ids,
        "asked": settings["long_text_tokens"],
        "mode": settings["mode"],
    }


# --------------------------------------------------------------------------------------------
# the reference, computed once per model revision, text and length, kept in the data folder


def data_folder(record: Record, settings: dict) -> Path:
    """The data folder the cache lives in: the sweep's (its work folder sits at
    ``<data>/sweeps/<id>/.work/``, where the probe's ``record_path`` points), else
    ``$MODEL_SUPPORT_DATA_DIR``, else ``data`` here (every command's default). Never a folder
    outside a data folder."""
    from ..paths import DATA_DIR_VAR

    sweep_id, record_path = record.get("sweep_id"), settings.get("record_path")
    if sweep_id and record_path:
        for parent in Path(record_path).resolve().parents:
            if parent.name == "sweeps" and (parent / sweep_id).is_dir():
                return parent.parent
    return Path(os.environ.get(DATA_DIR_VAR) or "data")


_fingerprints: dict[tuple, str] = {}
#: A folder's fingerprint reads at most this many evenly spaced chunks of this many bytes of each
#: file.
SAMPLES, SAMPLE_BYTES = 16, 65536


def folder_fingerprint(folder: Path) -> str:
    """A local model folder's revision: every file's name and size, and the whole of a small file
    or 16 evenly spaced 64 KiB chunks of a large one, hashed. A fingerprint rather than a
    checksum so a 14 GB model costs milliseconds, not a minute per probe; weights trained again
    differ in every chunk. Memoised per process by the files' sizes and modification times."""
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file() and not p.name.startswith("."))
    stats = tuple(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files
    )
    if stats in _fingerprints:
        return _fingerprints[stats]
    digest = hashlib.sha256()
    for path, (name, size, _) in zip(files, stats, strict=True):
        digest.update(f"{name}\0{size}\0".encode())
        with open(path, "rb") as handle:
            if size <= SAMPLES * SAMPLE_BYTES:
                digest.update(handle.read())
                continue
            for k in range(SAMPLES):
                handle.seek((size - SAMPLE_BYTES) * k // (SAMPLES - 1))
                digest.update(handle.read(SAMPLE_BYTES))
    _fingerprints[stats] = digest.hexdigest()
    return _fingerprints[stats]


def model_revision(record: Record, settings: dict) -> str:
    """The model's revision as the cache keys it: the Hub commit the files came at, else the
    folder's fingerprint."""
    if record.get("revision_sha"):
        return str(record["revision_sha"])
    return "files-" + folder_fingerprint(Path(settings["load_from"]))[:20]


def reference_dtype(record: Record, settings: dict) -> str:
    from .agreement import reference_dtype as dtype_of

    return dtype_of(record.get("device_type"), settings["dtype"])


def reference_file(data_dir: Path, record: Record, settings: dict, ids: list[int]) -> Path:
    """Where the reference's top ``TOP_K`` for this model revision, text, length (the ids' own
    hash: the same text through another tokenizer is another key) and reference dtype is kept,
    under the data folder (a model id of dots, ``..``, is no way out of it)."""
    slug = (
        "".join(c if c.isalnum() or c in "-._" else "_" for c in str(record["model_id"]))[
            :80
        ].lstrip(".")
        or "_"
    )
    key = hashlib.sha256(
        json.dumps(
            [model_revision(record, settings), text_id(), ids, reference_dtype(record, settings)]
        ).encode()
    ).hexdigest()[:24]
    return Path(data_dir) / CACHE_FOLDER / slug / f"{TEXT_NAME}-{len(ids)}-{key}.json"


def compute_reference(load_from: str, settings: dict, ids: list[int], dtype: str) -> dict:
    """The reference's top ``TOP_K`` token ids and log-probabilities per position: the model on
    the CPU in ``dtype``, one forward pass over ``ids`` (teacher forcing), as the verdict's
    reference runs."""
    import torch

    from .probe_core import load

    model, _ = load(
        load_from,
        settings["revision"],
        dtype,
        settings["trust_remote_code"],
        torch.device("cpu"),
        {},
        task=settings["task"],
    )
    from .agreement import MASKED

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].double()
        # a padded vocabulary's masks are no logits
        live = logits > logits.max(dim=-1, keepdim=True).values - MASKED
        logits = logits.masked_fill(~live, -torch.inf)
        logprobs = torch.log_softmax(logits, dim=-1)
        values, top = logprobs.topk(TOP_K, dim=-1)
        count = live.sum(dim=-1)
        mean = logits.where(live, 0.0).sum(dim=-1) / count
        spreads = ((logits - mean[:, None]).where(live, 0.0).square().sum(dim=-1) / count).sqrt()
    return {
        "ids": top.tolist(),
        "logprobs": [[round(v, 6) for v in row] for row in values.tolist()],
        # each position's logit spread: its relative margin
        "spreads": [round(v, 5) for v in spreads.tolist()],
    }


class ReferenceUnusable(Exception):
    """The cached reference cannot be used and the reference must not run here: the note says
    why."""


def reference_for(
    record: Record, settings: dict, ids: list[int], reference_skip: str | None = None
) -> tuple[dict, str]:
    """The reference's top ``TOP_K`` per position, read from the data folder when an earlier
    probe of this revision, text and length computed it (and its ids are these ids), else
    computed and kept there; with a few words saying which. A cache that cannot be written is
    said, and the reference still used. A file from before the spreads were kept (each position's
    relative margin) is computed again, unless ``reference_skip`` says the reference must not run
    here (too big for the host, switched off): then it is read as it is, with the fixed margin."""
    path = reference_file(data_folder(record, settings), record, settings, ids)
    if path.is_file():
        try:
            kept = json.loads(path.read_text())
            usable = kept.get("token_ids") == ids and len(kept.get("ids") or []) == len(ids)
            if "spreads" in kept and len(kept["spreads"]) != len(ids):
                usable = False
            if usable:
                if "spreads" in kept:
                    return (
                        kept,
                        f"reference top-{TOP_K} read from {CACHE_FOLDER}/ (computed "
                        f"{kept.get('computed_at')})",
                    )
                if reference_skip:
                    return kept, (
                        f"reference top-{TOP_K} read from {CACHE_FOLDER}/ (computed "
                        f"{kept.get('computed_at')}, before the spreads were kept: the fixed "
                        "margin only)"
                    )
        except (OSError, ValueError, AttributeError):
            pass  # unreadable: computed again, and written over
    # never load a reference the probe was told not to run: the cache is all there is
    if reference_skip:
        raise ReferenceUnusable(
            f"not run: the cached reference in {CACHE_FOLDER}/ is unusable ({reference_skip})"
        )
    dtype = reference_dtype(record, settings)
    found = compute_reference(settings["load_from"], settings, ids, dtype)
    kept = {
        "model_id": record["model_id"],
        "revision": model_revision(record, settings),
        "text": text_id(),
        "dtype": dtype,
        "token_ids": ids,
        **found,
        "computed_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    try:
        # ~90 KB per 1,024 positions
        atomic_write_text(path, json.dumps(kept, separators=(",", ":")) + "\n")
    except OSError as exc:
        return kept, f"reference top-{TOP_K} computed on the CPU ({dtype}); not kept: {exc}"
    return kept, f"reference top-{TOP_K} computed on the CPU ({dtype}) and kept in {CACHE_FOLDER}/"


# --------------------------------------------------------------------------------------------
# the comparison


def _position(
    device_ids: list[int],
    device_logits: list[float],
    ref_ids: list[int],
    ref_lp: list[float],
    margin,
):
    """One position: (top-1 agrees, top-5 agrees, diverges, the device's token, its flip in nats
    or None outside the reference's top 5). Of the device's exactly tied best tokens, the one the
    reference ranks highest counts."""
    best = max(device_logits)
    tied = [t for t, v in zip(device_ids, device_logits, strict=True) if v == best]
    rank = {t: r for r, t in enumerate(ref_ids)}
    chosen = min(tied, key=lambda t: rank.get(t, len(ref_ids)))
    if chosen not in rank:
        return False, False, True, chosen, None
    flip = ref_lp[0] - ref_lp[rank[chosen]]
    return rank[chosen] == 0, True, flip > margin, chosen, flip


def _edges(tokens: int, size: int = WINDOW) -> list[int]:
    """Where ``windows``' windows start and end: every ``size`` positions; a last window shorter
    than half of ``size`` joins the one before (too few positions to be a rate of its own)."""
    edges = list(range(0, tokens, size)) + [tokens]
    if len(edges) > 2 and edges[-1] - edges[-2] < size // 2:
        del edges[-2]
    return edges


def shortest_window(tokens: int, size: int = WINDOW) -> int:
    """The fewest positions of any window ``windows`` makes over ``tokens`` positions."""
    edges = _edges(max(tokens, 1), size)
    return min(b - a for a, b in zip(edges, edges[1:]))


def tolerance(tokens: int | None) -> float:
    """How far a rate over ``tokens`` positions may fall before it says something: ``TOLERANCE``,
    or two positions of the shortest window where that is more (one stray position is no fault; a
    short last window is where a stray weighs most)."""
    return max(TOLERANCE, 2 / shortest_window(tokens or WINDOW))


def proven(rate: float, tokens: int | None) -> bool:
    """A long text that agrees enough to prove a run right (``ops.proof.rerun_wrong``): its rate
    at least 1 - ``tolerance`` (compared by positions, not by a float's last bit)."""
    return rate >= 1 - tolerance(tokens) - 1e-9


def windows(flags: list[bool], size: int = WINDOW) -> list[float]:
    """Top-1 agreement per window of ``size`` positions; a last window shorter than half of
    ``size`` joins the one before (too few positions to be a rate of its own)."""
    edges = _edges(len(flags), size)
    return [sum(flags[a:b]) / (b - a) for a, b in zip(edges, edges[1:]) if b > a]


def compare(
    found: dict, reference: dict, margin: float, decode=None, relative_margin: float | None = None
) -> dict:
    """The device's two paths (``on_device``'s result) against the reference's top ``TOP_K`` per
    position: the record's ``RECORD_FIELDS`` but ``long_text_device_s``'s source and the note's
    prefix. A position's margin is ``margin`` nats or ``relative_margin``
    (``agreement.DEFAULT_RELATIVE_MARGIN``) of the reference's spread there, whichever is
    smaller. ``decode``: the tokenizer's, to name tokens in the note."""
    from .agreement import DEFAULT_RELATIVE_MARGIN

    share = DEFAULT_RELATIVE_MARGIN if relative_margin is None else relative_margin
    n = len(reference["ids"])
    spreads = reference.get("spreads") or [None] * n
    margins = [margin if w is None else min(margin, share * w) for w in spreads]
    out: dict = {"long_text_tokens": n, "long_text_text": found["text"]}
    first_flip, lowest, said = None, [], []
    for path in PATHS:
        rows = [
            _position(
                found[path]["ids"][p],
                found[path]["logits"][p],
                reference["ids"][p],
                reference["logprobs"][p],
                margins[p],
            )
            for p in range(n)
        ]
        top1 = [r[0] for r in rows]
        out[f"long_text_{path}_top1"] = sum(top1) / n
        out[f"long_text_{path}_top5"] = sum(r[1] for r in rows) / n
        diverges = next((p for p, r in enumerate(rows) if r[2]), None)
        out[f"long_text_{path}_diverges_at"] = diverges
        flip = next((p for p, agrees in enumerate(top1) if not agrees), None)
        if flip is not None and (first_flip is None or flip < first_flip):
            first_flip = flip
        # agreement within the margin: near-ties agree
        lowest.append(min(windows([not r[2] for r in rows])))
        text = (
            f"{path}: top-1 {out[f'long_text_{path}_top1']:.1%}, top-5 "
            f"{out[f'long_text_{path}_top5']:.1%}"
        )
        if diverges is not None:
            _, _, _, token, nats = rows[diverges]
            where = (
                "outside the reference's top 5"
                if nats is None
                else f"{nats:.3g} nats below its best"
            )
            best = reference["ids"][diverges][0]
            text += (
                f", diverges at position {diverges}: the device's {_token(decode, token)} is "
                f"{where} {_token(decode, best)}"
            )
        said.append(text)
    out["long_text_first_disagreement"] = first_flip
    out["long_text_rate"] = min(lowest)
    window = (
        f"lowest agreement within the margin over windows of {WINDOW} positions "
        f"{out['long_text_rate']:.1%}"
    )
    first = (
        f"first disagreement at position {first_flip}"
        if first_flip is not None
        else "every position agrees"
    )
    out["long_text_note"] = (
        f"{n} positions of {TEXT_NAME}: " + "; ".join(said) + f"; {first}; {window}"
    )
    return out


def _token(decode, token: int) -> str:
    if decode is None:
        return f"({token})"
    try:
        return f"{decode([token])!r} ({token})"
    except Exception:  # noqa: BLE001 a token the tokenizer cannot decode is still named by its id
        return f"({token})"


def _decoder(load_from: str, settings: dict):
    """The tokenizer's decode, to name tokens in the note; None where it does not load (the ids
    still say)."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            load_from,
            revision=settings["revision"] or None,
            trust_remote_code=settings["trust_remote_code"],
        )
        return tokenizer.decode
    except Exception:  # noqa: BLE001 the names are a courtesy
        return None


def check(
    record: Record, settings: dict, found: dict | None, reference_skip: str | None = None
) -> None:
    """The host's half (``checks.check_pass``): the device's paths against the reference's top
    ``TOP_K``, read from the data folder or computed there once, onto ``record``'s
    ``RECORD_FIELDS``; or, where the check did not run, only ``long_text_note`` saying why. Never
    changes the verdict."""
    if found is None:
        if wanted(settings):
            record["long_text_note"] = (
                "not run: the device phase ran no long text (it runs on one device, after a PASS)"
            )
        return
    if "note" in found:
        record["long_text_note"] = found["note"]
        return
    ids = found["ids"]
    if (
        reference_skip
        and not reference_file(data_folder(record, settings), record, settings, ids).is_file()
    ):
        record["long_text_note"] = (
            f"not run: no reference to compare with ({reference_skip}) and none cached"
        )
        return
    try:
        reference, whence = reference_for(record, settings, ids, reference_skip)
    except ReferenceUnusable as exc:
        record["long_text_note"] = str(exc)
        return
    compared = compare(
        found, reference, settings["numerics_margin"], _decoder(settings["load_from"], settings)
    )
    compared["long_text_device_s"] = found["device_s"]
    eager = (
        " (eager: the compiled forward is the verdict's only)"
        if found.get("mode") == "compile"
        else ""
    )
    compared["long_text_note"] = (
        f"{compared['long_text_note']}; device {found['prefill_s']:.2f} s prefill + "
        f"{found['decode_s']:.2f} s decode{eager}; {whence}"
    )[:2000]
    from ..record.schema import fill

    fill(record, compared)
