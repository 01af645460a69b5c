"""Debug one failing model: which module raises, which module diverges, at which generation step.

``notebooks/debug.ipynb`` calls these functions, one cell each, and shows what they return:

1. ``load_for_debug``: the model and its prompt exactly as the probe loads them (``probe_core.load``
   and ``probe_core.build_inputs``);
2. ``trace_forward``: one forward pass with forward pre-hooks and forward hooks on every module.
   Pre-hooks push the module (with its input shapes and dtypes) on a stack, exit hooks pop it, so
   when the forward raises, the innermost module entered but not exited is the culprit
   (``ForwardTrace.failure``, see ``ModuleTracer``). With ``capture=True`` each module's output (the
   first tensor of a tuple, dict or dataclass output) is kept on the CPU in float32;
3. ``compare_traces``: the same pass on a CPU reference copy (``reference_dtype``) against the
   device's, module call by module call: max absolute and relative difference and non-finite counts,
   in the order the modules finished (forward hooks). The first offender is the first module whose
   relative difference exceeds the tolerance, or whose device output has inf/nan where the reference
   has finite values. ``table_html`` and ``divergence_chart`` show it;
4. ``generate_steps``: the probe's greedy generation (``probe_core.generate``) with a streamer
   counting new tokens and the module hooks on: the step at which generation fails, the sequence
   length then, and the module that raised;
5. ``build_result`` / ``show``: the main findings as one JSON-safe dict, displayed with the output
   metadata ``{"model_support": {"debug": True}}`` so tools read it back from the executed notebook
   (``debug_result_from_notebook``).

``run_debug_notebook`` executes the notebook with papermill for one model of a sweep, with that
sweep's probe settings, into ``<sweep_dir>/debug/<safe_name>.ipynb``.

Definitions used throughout:

- *relative difference* of a module output: ``max|device - reference| / max|reference|`` over the
  positions where both are finite. Relative to the reference's largest magnitude rather than
  element-wise, so that bf16 rounding of near-zero values does not look like a divergence;
- *new non-finite*: positions where the device output is inf or nan and the reference is finite.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Mapping
from pathlib import Path

from . import probe_core, provenance, store
from .probe import first_divergence

#: Output metadata key (shared with the probe's record) and the flag that marks the debug result.
NOTEBOOK_KEY = "model_support"
DEBUG_FLAG = "debug"
DEBUG_NOTEBOOK = provenance.REPO_ROOT / "notebooks" / "debug.ipynb"
#: Default relative tolerance. Differences accumulate along the pass (each module sees the device's
#: own, already rounded, inputs): bf16 against a float32 reference peaks at 0.08 on the healthy
#: SmolLM2-135M-Instruct, while an overflow, a wrong kernel or a wrong mask gives O(1) or inf/nan.
DEFAULT_TOLERANCE = 0.2
ROOT_LABEL = "(model)"
_MAX_CANDIDATES_LISTED = 12


# --- looking inside module inputs and outputs ----------------------------------------------------

def first_tensor(obj, _depth: int = 0):
    """The first tensor in a module's output: the tensor itself, else the first one found (depth
    first) in a tuple, list, dict, ``ModelOutput`` or dataclass; None when there is none."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj
    if _depth > 4 or obj is None:
        return None
    if isinstance(obj, Mapping):
        values = list(obj.values())
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        values = [getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
    elif isinstance(obj, (tuple, list)):
        values = list(obj)
    else:
        return None
    for value in values:
        found = first_tensor(value, _depth + 1)
        if found is not None:
            return found
    return None


def describe_tensor(tensor) -> dict:
    return {"shape": list(tensor.shape), "dtype": str(tensor.dtype), "device": str(tensor.device)}


def describe_inputs(args: tuple, kwargs: dict | None = None) -> list[dict]:
    """Shape, dtype and device of every tensor argument (also inside tuples and lists, one level)."""
    import torch

    described = []

    def add(label, value):
        if isinstance(value, torch.Tensor):
            described.append({"arg": label, **describe_tensor(value)})
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    described.append({"arg": f"{label}[{i}]", **describe_tensor(item)})

    for i, value in enumerate(args):
        add(f"args[{i}]", value)
    for key, value in (kwargs or {}).items():
        add(key, value)
    return described


def _class_path(module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def _module_summary(module) -> str:
    try:
        text = module.extra_repr()
    except Exception:  # a broken extra_repr must not hide the real failure
        text = ""
    return text[:300]


# --- the tracer ------------------------------------------------------------------------------------

@dataclasses.dataclass
class ForwardTrace:
    """What one traced forward pass saw.

    ``calls``: one dict per completed module call, in completion order (forward hooks): index, name
    (qualified; "" is the model itself), class, call (n-th call of that module in this pass), and,
    when captured, shape, dtype, inf and nan counts of its first output tensor. ``outputs``:
    (name, call) -> that tensor on the CPU in float32 (``capture=True`` only). ``failure``: None, or
    the innermost module entered but not exited when the forward raised (see ``ModuleTracer``).
    """

    calls: list[dict]
    outputs: dict
    failure: dict | None
    dtype: str | None = None
    device: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class ModuleTracer:
    """Forward hooks on every module of ``model``, as a context manager: who raised, what ran.

    A forward pre-hook pushes each module (with its input shapes and dtypes) on ``stack`` as it is
    entered; a forward hook registered with ``always_call=True`` pops it as it exits, normally or by
    an exception (torch runs such hooks on the exception path too, before re-raising). A module that
    exits by an exception is recorded in ``raised`` with the modules entered around it at that
    moment and the exception itself. So the culprit of the exception that finally escapes is the
    innermost module entered but not exited when it was raised: the first one recorded with that
    exception (or one it was chained from), even when the model caught an earlier exception of
    another module and carried on (``failure_from``).

    A plain forward hook, run only on a normal exit, records each completed call in ``calls`` (and,
    with ``capture``, its first output tensor, on the CPU in float32).
    """

    def __init__(self, model, capture: bool = False):
        self.model = model
        self.capture = capture
        self.names = {id(module): name for name, module in model.named_modules()}
        self.stack: list[dict] = []
        self.raised: list[dict] = []
        self.calls: list[dict] = []
        self.outputs: dict = {}
        self.root_calls = 0
        self._counts: dict[str, int] = {}
        self._handles: list = []

    def __enter__(self):
        for _, module in self.model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._completed, with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._exit, with_kwargs=True, always_call=True))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        return False

    def _enter(self, module, args, kwargs):
        name = self.names.get(id(module), "?")
        if name == "":
            self.root_calls += 1
        self.stack.append({"module": module, "name": name, "inputs": describe_inputs(args, kwargs), "done": False})
        return None

    def _top_entry(self, module) -> int | None:
        for depth in range(len(self.stack) - 1, -1, -1):
            if self.stack[depth]["module"] is module:
                return depth
        return None

    def _completed(self, module, args, kwargs, output):
        depth = self._top_entry(module)
        if depth is not None:
            self.stack[depth]["done"] = True
        name = self.names.get(id(module), "?")
        call = self._counts.get(name, 0)
        self._counts[name] = call + 1
        entry = {"index": len(self.calls), "name": name, "class": type(module).__name__, "call": call}
        if self.capture:
            tensor = first_tensor(output)
            if tensor is not None:
                import torch

                copy = tensor.detach().to("cpu")
                copy = copy.to(torch.float32) if not copy.is_complex() else copy.abs().to(torch.float32)
                entry.update(shape=list(tensor.shape), dtype=str(tensor.dtype),
                             inf=int(torch.isinf(copy).sum()), nan=int(torch.isnan(copy).sum()))
                self.outputs[(name, call)] = copy
        self.calls.append(entry)
        return None

    def _exit(self, module, args, kwargs, output):
        import sys

        depth = self._top_entry(module)
        if depth is None:
            return None
        entry = self.stack[depth]
        if not entry["done"]:  # exited by an exception: we are on torch's exception path
            self.raised.append({"entry": entry, "stack": [e["name"] for e in self.stack[:depth + 1]],
                                "exception": sys.exc_info()[1]})
        del self.stack[depth:]
        return None

    def culprit(self, exc: BaseException) -> tuple[dict | None, list[str]]:
        """(stack entry, names of the modules entered around it) of the innermost module that raised
        ``exc`` or an exception it was chained from; (None, []) when no module raised it."""
        chain, seen = [], set()
        current = exc
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            chain.append(current)
            current = current.__cause__ or current.__context__
        for candidate in reversed(chain):  # the original cause first
            for record in self.raised:
                if record["exception"] is candidate:
                    return record["entry"], record["stack"]
        if self.stack:  # raised while the hooks could not see the exit (should not happen)
            return self.stack[-1], [e["name"] for e in self.stack]
        return None, []

    def failure_from(self, exc: BaseException) -> dict:
        """The culprit of ``exc`` (None fields when no module was running), with its input shapes and
        dtypes, the chain of modules around it (outer to inner), and the exception."""
        culprit, stack = self.culprit(exc)
        return {
            "module": culprit["name"] if culprit else None,
            "class": type(culprit["module"]).__name__ if culprit else None,
            "class_path": _class_path(culprit["module"]) if culprit else None,
            "module_summary": _module_summary(culprit["module"]) if culprit else None,
            "inputs": culprit["inputs"] if culprit else [],
            "stack": stack,
            "error_type": type(exc).__name__,
            "error_message": str(exc)[:4000],
            "traceback": probe_core.trimmed_traceback(exc),
        }


def model_device(model):
    import torch

    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def model_dtype(model) -> str | None:
    for parameter in model.parameters():
        return str(parameter.dtype).removeprefix("torch.")
    return None


def trace_forward(model, input_ids, attention_mask=None, capture: bool = True, synchronize=None) -> ForwardTrace:
    """One forward pass of ``model`` (inputs moved to its device) with every module hooked.

    Never raises for the model's own exception: it is ``ForwardTrace.failure``. ``synchronize`` (the
    device adapter's) runs after the pass, so an asynchronous device error surfaces here too.
    Capturing copies every module's output to the CPU, which also forces each one to be computed
    on lazy backends: pass ``capture=False`` to find where a forward raises without that."""
    import torch

    device = model_device(model)
    kwargs = {"input_ids": input_ids.to(device)}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask.to(device)
    tracer = ModuleTracer(model, capture=capture)
    failure = None
    with tracer, torch.inference_mode():
        try:
            model(**kwargs)
            if synchronize:
                synchronize()
        except Exception as exc:  # the model's failure is the finding, recorded with its module
            failure = tracer.failure_from(exc)
    return ForwardTrace(calls=tracer.calls, outputs=tracer.outputs, failure=failure,
                        dtype=model_dtype(model), device=str(device))


# --- comparing a device pass with the reference ------------------------------------------------------

COLUMNS = ("index", "module", "class", "call", "shape", "device_dtype", "max_abs_diff", "max_rel_diff",
           "device_inf", "device_nan", "reference_inf", "reference_nan", "new_nonfinite", "exceeds",
           "first_offender", "note")


def compare_tensors(device, reference) -> dict:
    """Differences between two CPU float32 tensors of the same shape (see the module docstring)."""
    import torch

    dev_finite, ref_finite = torch.isfinite(device), torch.isfinite(reference)
    both = dev_finite & ref_finite
    if bool(both.any()):
        diff = (device[both] - reference[both]).abs()
        max_abs = float(diff.max())
        scale = float(reference[both].abs().max())
    else:
        max_abs, scale = 0.0, 0.0
    if max_abs == 0.0:
        max_rel = 0.0
    elif scale > 0.0:
        max_rel = max_abs / scale
    else:
        max_rel = math.inf
    return {
        "max_abs_diff": max_abs, "max_rel_diff": max_rel,
        "device_inf": int(torch.isinf(device).sum()), "device_nan": int(torch.isnan(device).sum()),
        "reference_inf": int(torch.isinf(reference).sum()), "reference_nan": int(torch.isnan(reference).sum()),
        "new_nonfinite": int((~dev_finite & ref_finite).sum()),
    }


def compare_traces(device: ForwardTrace, reference: ForwardTrace, tolerance: float = DEFAULT_TOLERANCE):
    """One row per module call of the device pass, in completion order, against the reference's
    same call (same module, same n-th call): a polars DataFrame with ``COLUMNS``.

    A row ``exceeds`` when its relative difference is above ``tolerance``, its device output has new
    non-finite values, or the shapes differ; ``first_offender`` marks the first such row."""
    import polars as pl

    rows = []
    for call in device.calls:
        key = (call["name"], call["call"])
        row = {"index": call["index"], "module": call["name"], "class": call["class"], "call": call["call"],
               "shape": str(call.get("shape")) if call.get("shape") is not None else None,
               "device_dtype": (call.get("dtype") or "").removeprefix("torch.") or None,
               "max_abs_diff": None, "max_rel_diff": None, "device_inf": call.get("inf"),
               "device_nan": call.get("nan"), "reference_inf": None, "reference_nan": None,
               "new_nonfinite": None, "exceeds": False, "first_offender": False, "note": None}
        dev, ref = device.outputs.get(key), reference.outputs.get(key)
        if dev is None:
            row["note"] = "no tensor output"
        elif ref is None:
            row["note"] = "not run by the reference"
        elif tuple(dev.shape) != tuple(ref.shape):
            row["note"] = f"shape {list(dev.shape)} on the device, {list(ref.shape)} in the reference"
            row["exceeds"] = True
        else:
            row.update(compare_tensors(dev, ref))
            row["exceeds"] = row["max_rel_diff"] > tolerance or row["new_nonfinite"] > 0
        rows.append(row)
    for row in rows:
        if row["exceeds"]:
            row["first_offender"] = True
            break
    schema = {"index": pl.Int64, "module": pl.String, "class": pl.String, "call": pl.Int64, "shape": pl.String,
              "device_dtype": pl.String, "max_abs_diff": pl.Float64, "max_rel_diff": pl.Float64,
              "device_inf": pl.Int64, "device_nan": pl.Int64, "reference_inf": pl.Int64, "reference_nan": pl.Int64,
              "new_nonfinite": pl.Int64, "exceeds": pl.Boolean, "first_offender": pl.Boolean, "note": pl.String}
    return pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)


def first_offender(table) -> dict | None:
    """The first offending row of ``compare_traces``'s table as a dict, or None."""
    hits = table.filter(table["first_offender"])
    return hits.row(0, named=True) if hits.height else None


def offender_reason(row: dict, tolerance: float) -> str:
    if row["note"] and row["max_abs_diff"] is None:
        return row["note"]
    parts = []
    if row["new_nonfinite"]:
        parts.append(f"{row['new_nonfinite']} non-finite value(s) on the device where the reference is finite "
                     f"(inf {row['device_inf']}, nan {row['device_nan']})")
    if row["max_rel_diff"] is not None and row["max_rel_diff"] > tolerance:
        parts.append(f"relative difference {row['max_rel_diff']:.3g} > tolerance {tolerance:g}")
    return "; ".join(parts)


def divergence_chart(table, tolerance: float | None = None):
    """Max absolute difference per module call in execution order (log scale), the first offender
    highlighted. Zero differences sit on the floor and non-finite ones on the ceiling of the axis;
    the tooltip shows the true values."""
    import altair as alt
    import polars as pl

    data = table.filter(pl.col("max_abs_diff").is_not_null() | pl.col("exceeds"))
    positive = [v for v in data["max_abs_diff"].to_list() if v is not None and 0 < v < math.inf]
    floor = min(positive) / 10 if positive else 1e-12
    ceiling = max(positive) * 10 if positive else 1.0

    def plotted(row):
        value = row["max_abs_diff"]
        if row["new_nonfinite"] or value is None or value == math.inf:
            return ceiling
        return max(value, floor)

    def status(row):
        if row["first_offender"]:
            return "first offender"
        if row["new_nonfinite"]:
            return "new inf/nan on device"
        if row["exceeds"]:
            return "above tolerance"
        return "within tolerance"

    points_data = []
    for row in data.iter_rows(named=True):
        points_data.append({
            "index": row["index"], "module": _label(row["module"]), "class": row["class"], "call": row["call"],
            "max_abs_diff": _finite_or_none(row["max_abs_diff"]), "max_rel_diff": _finite_or_none(row["max_rel_diff"]),
            "new_nonfinite": row["new_nonfinite"], "plotted_diff": plotted(row), "status": status(row),
        })
    domain = ["within tolerance", "above tolerance", "new inf/nan on device", "first offender"]
    colors = ["#4c78a8", "#f58518", "#b279a2", "#d62728"]
    title = "Max |device - reference| per module, in execution order"
    if tolerance is not None:
        title += f" (relative tolerance {tolerance:g})"
    base = alt.Chart(alt.Data(values=points_data)).encode(
        x=alt.X("index:Q", title="module call (order of completion)"),
        y=alt.Y("plotted_diff:Q", scale=alt.Scale(type="log"), title="max abs diff (log)"),
        tooltip=["index:Q", "module:N", "class:N", "call:Q", alt.Tooltip("max_abs_diff:Q", format=".3g"),
                 alt.Tooltip("max_rel_diff:Q", format=".3g"), "new_nonfinite:Q", "status:N"],
    )
    line = base.mark_line(color="#bbbbbb", strokeWidth=1)
    points = base.mark_point(filled=True).encode(
        color=alt.Color("status:N", scale=alt.Scale(domain=domain, range=colors), title=None),
        size=alt.condition(alt.datum.status == "first offender", alt.value(160), alt.value(30)),
    )
    layers = [line, points]
    offender = [row for row in points_data if row["status"] == "first offender"]
    if offender:
        label = alt.Chart(alt.Data(values=offender)).mark_text(align="left", dx=8, dy=-8, color="#d62728").encode(
            x="index:Q", y=alt.Y("plotted_diff:Q", scale=alt.Scale(type="log")), text="module:N")
        rule = alt.Chart(alt.Data(values=offender)).mark_rule(color="#d62728", strokeDash=[4, 3]).encode(x="index:Q")
        layers += [rule, label]
    return alt.layer(*layers).properties(width=720, height=280, title=title)


def _finite_or_none(value):
    return value if value is not None and math.isfinite(value) else None


def chart_bundle(chart) -> dict:
    """A display bundle for an Altair chart that needs no network: the Vega-Lite spec (JupyterLab
    draws it, with tooltips) and the same chart as SVG (for viewers without a Vega-Lite renderer)."""
    import altair as alt

    spec = chart.to_dict()
    major = alt.SCHEMA_VERSION.lstrip("v").split(".")[0]
    bundle = {f"application/vnd.vegalite.v{major}+json": spec, "text/plain": "<divergence chart>"}
    try:
        import vl_convert
        from altair.utils._importers import vl_version_for_vl_convert

        bundle["image/svg+xml"] = vl_convert.vegalite_to_svg(spec, vl_version=vl_version_for_vl_convert())
    except ImportError:  # vl-convert is optional: JupyterLab draws the spec itself
        pass
    return bundle


def show_chart(chart):
    from IPython.display import display

    display(chart_bundle(chart), raw=True)


# --- generation, step by step ---------------------------------------------------------------------------

class TokenCounter:
    """A generate() streamer that keeps every new token (the first ``put`` is the prompt)."""

    def __init__(self):
        self.tokens: list[int] = []
        self._seen_prompt = False

    def put(self, value):
        if not self._seen_prompt:
            self._seen_prompt = True
            return
        self.tokens.extend(int(t) for t in value.reshape(-1).tolist())

    def end(self):
        pass


def generate_steps(model, tokenizer, input_ids, attention_mask, max_new_tokens: int, device=None,
                   seed: int = 0) -> dict:
    """The probe's greedy generation (``probe_core.generate``), watched step by step.

    Step ``s`` is the forward that produces new token ``s`` (0-based): step 0 processes the prompt
    (``tokens_in`` tokens), step ``s >= 1`` feeds the token generated at step ``s - 1``. When it
    raises:

    - ``step``: the 0-based index of the new token whose forward raised = the number of new tokens
      generated before it (the probe's ``failed_step``);
    - ``seq_len``: the number of tokens in the sequence when that forward runs, including the ones it
      processes: ``tokens_in + step`` (the prompt plus the ``step`` tokens generated so far, the
      last of which is being fed). Its positions are ``0 .. seq_len - 1``;
    - ``failure``: the innermost module running when it raised (``ModuleTracer``), with its input
      shapes and dtypes, and the exception.

    ``forward_calls`` counts the model's top-level forward calls (the failing one included).
    """
    import torch

    device = device if device is not None else model_device(model)
    tokens_in = int(input_ids.shape[1])
    counter = TokenCounter()
    tracer = ModuleTracer(model, capture=False)
    torch.manual_seed(seed)
    result = {"ok": True, "tokens_in": tokens_in, "max_new_tokens": max_new_tokens, "tokens_out": None,
              "output_token_ids": None, "step": None, "seq_len": None, "forward_calls": None, "failure": None}
    with tracer:
        try:
            new_ids = probe_core.generate(model, tokenizer, input_ids, attention_mask, max_new_tokens, device,
                                          timer=counter)
        except Exception as exc:  # the failure is the finding
            result.update(ok=False, step=len(counter.tokens), seq_len=tokens_in + len(counter.tokens),
                          failure=tracer.failure_from(exc), output_token_ids=list(counter.tokens),
                          tokens_out=len(counter.tokens))
        else:
            result.update(output_token_ids=list(new_ids), tokens_out=len(new_ids))
    result["forward_calls"] = tracer.root_calls
    return result


# --- loading, as the probe does --------------------------------------------------------------------------

def load_for_debug(model_id: str, revision: str, dtype: str, trust_remote_code: bool, device, prompt: str,
                   chat_template: str) -> dict:
    """Model, tokenizer and prompt exactly as the probe has them (``probe_core.load`` and
    ``build_inputs``): a dict with model, tokenizer, input_ids, attention_mask, chat_template_used,
    tokens_in and info (model_type, architectures, num_params)."""
    info: dict = {}
    model, tokenizer = probe_core.load(model_id, revision, dtype, trust_remote_code, device, info)
    input_ids, attention_mask, used = probe_core.build_inputs(tokenizer, prompt, chat_template)
    return {"model": model, "tokenizer": tokenizer, "input_ids": input_ids, "attention_mask": attention_mask,
            "chat_template_used": used, "tokens_in": int(input_ids.shape[1]), "info": info}


def load_reference(model_id: str, revision: str, reference_dtype: str, trust_remote_code: bool):
    """The CPU reference copy of the model, in ``reference_dtype``."""
    import torch

    model, _ = probe_core.load(model_id, revision, reference_dtype, trust_remote_code, torch.device("cpu"), {})
    return model


# --- the result ----------------------------------------------------------------------------------------------

def _json_safe(value):
    """Non-finite floats as strings ("inf", "nan"): notebook JSON has no inf."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def build_result(settings: dict, loaded: dict | None, device_type: str | None, forward: ForwardTrace | None,
                 table=None, generation: dict | None = None, reference_generation: dict | None = None) -> dict:
    """The findings as one JSON-safe dict (what ``show`` displays and tools read back).

    ``forward_failure``: the first module whose forward raised on the device (None when the pass ran);
    ``first_offender``: the first module whose output diverges from the reference (None when none);
    ``generation``: step / seq_len / tokens_in / failing module of a generate-time failure, and the
    generated tokens against the reference's (``first_divergence``)."""
    tolerance = settings.get("tolerance", DEFAULT_TOLERANCE)
    result = {
        "model_id": settings.get("model_id"), "revision": settings.get("revision") or None,
        "device": settings.get("device"), "device_type": device_type, "dtype": settings.get("dtype"),
        "reference_dtype": settings.get("reference_dtype"), "tolerance": tolerance,
        "prompt": settings.get("prompt"), "chat_template": settings.get("chat_template"),
        "chat_template_used": loaded["chat_template_used"] if loaded else None,
        "tokens_in": loaded["tokens_in"] if loaded else None,
        "max_new_tokens": settings.get("max_new_tokens"), "seed": settings.get("seed"),
        "model_type": (loaded or {}).get("info", {}).get("model_type"),
        "forward_ok": forward.ok if forward is not None else None,
        "forward_failure": forward.failure if forward is not None else None,
        "modules_traced": len(forward.calls) if forward is not None else None,
        "first_offender": None, "modules_compared": None, "modules_exceeding": None,
        "generation": None, "versions": provenance.versions(),
    }
    if table is not None:
        compared = table.filter(table["max_abs_diff"].is_not_null())
        result["modules_compared"] = compared.height
        result["modules_exceeding"] = int(table["exceeds"].sum())
        row = first_offender(table)
        if row is not None:
            result["first_offender"] = {**row, "reason": offender_reason(row, tolerance)}
    if generation is not None:
        gen = {key: value for key, value in generation.items()}
        if reference_generation is not None:
            gen["reference_ok"] = reference_generation["ok"]
            gen["reference_token_ids"] = reference_generation["output_token_ids"]
            gen["reference_step"] = reference_generation["step"]
            gen["reference_failure"] = reference_generation["failure"]
            if generation["ok"] and reference_generation["ok"]:
                gen["first_divergence"] = first_divergence(generation["output_token_ids"],
                                                           reference_generation["output_token_ids"])
            else:
                gen["first_divergence"] = None
        result["generation"] = gen
    return _json_safe(result)


def summary_text(result: dict) -> str:
    """Three lines for the terminal: where the forward breaks, where it diverges, where generate fails."""
    failure = result.get("forward_failure")
    offender = result.get("first_offender")
    generation = result.get("generation") or {}
    lines = [
        f"forward:    {'raises in ' + failure['module'] + ' (' + failure.get('class', '') + ')' if failure else 'runs'}",
        f"divergence: {offender['module'] + ': ' + offender['reason'] if offender else 'none above tolerance ' + str(result.get('tolerance'))}",
    ]
    if generation and not generation.get("ok", True):
        lines.append(f"generate:   fails at step {generation.get('step')} (sequence length {generation.get('seq_len')})")
    elif generation:
        lines.append(f"generate:   {len(generation.get('output_token_ids') or [])} tokens, first divergence from reference: "
                     f"{generation.get('first_divergence')}")
    return "\n".join(lines)


def _label(name: str | None) -> str:
    return ROOT_LABEL if name == "" else str(name)


def _inputs_text(inputs: list[dict]) -> str:
    return ", ".join(f"{i['arg']}: {i['dtype'].removeprefix('torch.')}{i['shape']}" for i in inputs) or "no tensor inputs"


def failure_html(failure: dict | None, what: str) -> str:
    """One failure (``ModuleTracer.failure_from``) as HTML."""
    esc = html.escape
    if failure is None:
        return f"<p><b>{esc(what)}</b>: ran without an exception.</p>"
    where = (f"in <code>{esc(_label(failure['module']))}</code> ({esc(failure['class'])})"
             if failure["module"] is not None else "outside any module")
    rows = [
        ("module", f"{_label(failure['module'])} ({failure['class_path']})" if failure["module"] is not None else "-"),
        ("module settings", failure.get("module_summary") or "-"),
        ("inputs", _inputs_text(failure["inputs"])),
        ("entered, outer to inner", " > ".join(_label(n) for n in failure["stack"]) or "-"),
        ("exception", f"{failure['error_type']}: {failure['error_message']}"),
    ]
    body = "".join(f"<tr><th style='text-align:left;vertical-align:top'>{esc(k)}</th>"
                   f"<td style='text-align:left'>{esc(str(v))}</td></tr>" for k, v in rows)
    return (f"<p style='color:#cf222e'><b>{esc(what)}</b> raised {where}</p><table>{body}</table>"
            f"<details><summary>traceback</summary><pre>{esc(failure['traceback'])}</pre></details>")


def table_html(table, max_height: int = 420) -> str:
    """The comparison table as self-contained HTML, scrollable, the first offender highlighted."""
    esc = html.escape

    def fmt(value):
        if value is None:
            return ""
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value)

    shown = ("index", "module", "class", "call", "shape", "device_dtype", "max_abs_diff", "max_rel_diff",
             "device_inf", "device_nan", "reference_inf", "reference_nan", "new_nonfinite", "exceeds", "note")
    head = "".join(f"<th style='position:sticky;top:0;background:#fff'>{esc(c)}</th>" for c in shown)
    body = []
    for row in table.iter_rows(named=True):
        style = " style='background:#ffd7d5;font-weight:bold'" if row["first_offender"] else (
            " style='background:#fff4e5'" if row["exceeds"] else "")
        cells = "".join(f"<td style='white-space:nowrap'>{esc(_label(row[c]) if c == 'module' else fmt(row[c]))}</td>"
                        for c in shown)
        body.append(f"<tr{style}>{cells}</tr>")
    return (f"<div style='max-height:{max_height}px;overflow:auto'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table></div>")


def divergence_html(table, tolerance: float) -> str:
    esc = html.escape
    row = first_offender(table)
    if row is None:
        headline = (f"<p><b>No module diverges</b>: every compared module is within relative tolerance "
                    f"{tolerance:g} and has no new inf/nan ({table.height} module calls).</p>")
    else:
        headline = (f"<p style='color:#cf222e'><b>First divergence</b>: <code>{esc(_label(row['module']))}</code> "
                    f"({esc(row['class'])}, call {row['call']}, module call #{row['index']}): "
                    f"{esc(offender_reason(row, tolerance))}.</p>")
    return headline + table_html(table)


def generation_html(generation: dict, reference: dict | None = None) -> str:
    esc = html.escape
    parts = []
    if generation["ok"]:
        parts.append(f"<p><b>Generation</b> ran: {generation['tokens_out']} new token(s) "
                     f"{esc(str(generation['output_token_ids']))} after {generation['tokens_in']} prompt tokens.</p>")
    else:
        parts.append(f"<p style='color:#cf222e'><b>Generation fails at step {generation['step']}</b> (0-based index of "
                     f"the new token whose forward raised), with {generation['seq_len']} tokens in the sequence "
                     f"(tokens_in {generation['tokens_in']} + {generation['step']} generated; "
                     f"{generation['forward_calls']} forward call(s)).</p>")
        parts.append(failure_html(generation["failure"], f"Step {generation['step']}"))
    if reference is not None:
        if reference["ok"]:
            parts.append(f"<p>CPU reference: {esc(str(reference['output_token_ids']))}; first divergence: "
                         f"{first_divergence(generation['output_token_ids'] or [], reference['output_token_ids'])}.</p>")
        else:
            parts.append(f"<p>CPU reference fails too, at step {reference['step']} "
                         f"(in <code>{esc(_label(reference['failure']['module']))}</code>): not specific to the device.</p>")
    return "".join(parts)


def summary_html(result: dict) -> str:
    esc = html.escape
    gen = result.get("generation") or {}
    offender = result.get("first_offender")
    failure = result.get("forward_failure")
    rows = [
        ("model", result["model_id"]),
        ("device / dtype", f"{result['device_type']} / {result['dtype']} (reference cpu / {result['reference_dtype']})"),
        ("tokens_in", result["tokens_in"]),
        ("forward raises in",
         f"{_label(failure['module'])} ({failure['class']}): {failure['error_type']}" if failure else "-"),
        ("first divergence",
         f"{_label(offender['module'])} ({offender['class']}): {offender['reason']}" if offender else "-"),
        ("generation", "ran" if gen.get("ok") else (
            f"fails at step {gen.get('step')}, seq_len {gen.get('seq_len')}, in "
            f"{_label((gen.get('failure') or {}).get('module'))}" if gen else "-")),
        ("generated vs reference", f"{gen.get('output_token_ids')} vs {gen.get('reference_token_ids')} "
                                   f"(first divergence {gen.get('first_divergence')})" if gen else "-"),
    ]
    body = "".join(f"<tr><th style='text-align:left'>{esc(k)}</th><td style='text-align:left'>{esc(str(v))}</td></tr>"
                   for k, v in rows)
    return f"<h3>Debug summary</h3><table>{body}</table>"


def show(result: dict):
    """Display the summary and store the result in the output, tagged so readers find it."""
    from IPython.display import display

    text = (f"debug {result['model_id']}: forward_failure={(result['forward_failure'] or {}).get('module')} "
            f"first_offender={(result['first_offender'] or {}).get('module')} "
            f"generation_step={(result['generation'] or {}).get('step')}")
    display({"text/html": summary_html(result), "application/json": result, "text/plain": text},
            raw=True, metadata={NOTEBOOK_KEY: {DEBUG_FLAG: True}})


def show_html(markup: str):
    from IPython.display import HTML, display

    display(HTML(markup))


def debug_result_from_notebook(path) -> dict:
    """The result an executed debug notebook displayed with ``show``; ValueError when it has none."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("metadata", {}).get(NOTEBOOK_KEY, {}).get(DEBUG_FLAG):
                return dict(output["data"]["application/json"])
    raise ValueError(f"{path} holds no debug result (the notebook did not reach its show(result) cell).")


# --- running the notebook for one model of a sweep ---------------------------------------------------------

def notebook_parameters() -> dict[str, str]:
    """Parameter name -> declared type name, read from the debug notebook itself."""
    import papermill

    return {name: p["inferred_type_name"] for name, p in papermill.inspect_notebook(str(DEBUG_NOTEBOOK)).items()}


def _listing(ids: list[str]) -> str:
    shown = ", ".join(ids[:_MAX_CANDIDATES_LISTED])
    more = len(ids) - _MAX_CANDIDATES_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def resolve_model(meta: dict, model: str) -> dict:
    """The sweep's model entry for ``model``: its full id, its folder name (``store.safe_name``), or a
    fragment of either that matches exactly one model (case-insensitive). ValueError otherwise."""
    entries = meta.get("models") or []
    ids = [entry["model_id"] for entry in entries]
    sweep = meta.get("sweep_id", "?")
    for entry in entries:
        if model in (entry["model_id"], store.safe_name(entry["model_id"])):
            return entry
    needle = model.lower()
    matches = [entry for entry in entries
               if needle and (needle in entry["model_id"].lower() or needle in store.safe_name(entry["model_id"]).lower())]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ValueError(f"No model of sweep {sweep} matches {model!r}; candidates: {_listing(ids) or 'none'}.")
    raise ValueError(f"{model!r} matches {len(matches)} models of sweep {sweep}, give more of the id: "
                     f"{_listing([m['model_id'] for m in matches])}.")


def debug_notebook_path(data_dir, sweep_id: str, model_id: str, out_dir=None) -> Path:
    """Where ``run_debug_notebook`` writes: ``<out_dir or sweep_dir/debug>/<safe_name>.ipynb``."""
    folder = Path(out_dir) if out_dir is not None else store.sweep_dir(data_dir, sweep_id) / "debug"
    return folder / f"{store.safe_name(model_id)}.ipynb"


def debug_parameters(meta: dict, entry: dict, extra: dict | None = None) -> dict:
    """The notebook parameters for one model: the sweep's probe settings, then the model's
    overrides, then ``extra``, keeping only what the debug notebook declares. ``extra`` keys must all
    be declared (a typo is refused, not ignored)."""
    declared = notebook_parameters()
    unknown = sorted(set(extra or {}) - set(declared))
    if unknown:
        raise ValueError(f"Unknown debug notebook parameter(s) {', '.join(unknown)}; accepted: {', '.join(declared)}.")
    merged = {**(meta.get("probe") or {}), **(entry.get("overrides") or {}), **(extra or {}), "model_id": entry["model_id"]}
    return {key: value for key, value in merged.items() if key in declared}


def run_debug_notebook(data_dir, sweep_id: str, model: str, out_dir=None, *, parameters: dict | None = None,
                       execution_timeout: float | None = None) -> Path:
    """Execute ``notebooks/debug.ipynb`` for one model of a sweep, with the sweep's settings.

    ``model``: the full model id or a unique fragment of it (e.g. its folder name). Parameters are
    ``debug_parameters``. Writes ``<sweep_dir>/debug/<safe_name>.ipynb`` (or into ``out_dir``) and
    returns its path. When a cell raises, papermill's ``PapermillExecutionError`` propagates; the
    executed notebook is still written at ``debug_notebook_path(...)`` and shows the error."""
    import papermill

    from .kernels import ipc_kernel

    meta = store.read_sweep(data_dir, sweep_id)
    entry = resolve_model(meta, model)
    params = debug_parameters(meta, entry, parameters)
    out = debug_notebook_path(data_dir, sweep_id, entry["model_id"], out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with ipc_kernel() as km:  # as the sweep's probes: parallel runs never collide on ports
        papermill.execute_notebook(str(DEBUG_NOTEBOOK), str(out), parameters=params, kernel_name="python3",
                                   progress_bar=False, execution_timeout=execution_timeout, km=km)
    return out

