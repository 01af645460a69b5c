"""One aten operator, run on the device and on the CPU from the same inputs, and judged: what
``localise`` asks of every operator of a forward, and the program of every one-operator repro script
(``op_repro``).

This module's source is the body of those scripts, so it imports nothing of this package, and torch
only inside its functions (a script sets the backend's configuration before torch loads).

**When is an output wrong?** The CPU's output from the device's own inputs is the reference; a
device may differ from it by rounding without being wrong: its kernels reduce in another order (a
matmul's, a softmax's or a mean's sum), use other approximations of ``exp`` or ``rsqrt`` (an ulp or
two), and run float32 matrix products on their matrix units in less precision (TF32 on CUDA; one
bf16 pass, a TPU's default). So each floating output is judged against an epsilon of the precision
it was computed in (``epsilon``): bf16 2^-7, fp16 2^-10; float32 2^-13 (a few hundred float32 ulps:
a sum over 10^5 terms in another order, approximate transcendentals), but a float32 matrix product
(``MATMULS``; the math attention's ``bmm`` runs in float32 even in a bf16 model) 2^-7, as bf16's;
float64 2^-23. Two criteria, either of which flags an output:

- *the whole output*: the relative RMS error ``||device - cpu|| / ||cpu||`` above ``NORM_ULPS``
  (1.5) epsilons. Rounding each value once, or in another order, moves an output by at most about
  half an epsilon RMS, and bf16-sized noise on every value (0.4%) stays near 0.5 epsilons: not a
  fault; every value off by 2% is 2.6 bf16 epsilons: a fault;
- *any one value*: ``|device - cpu|`` above ``ELEMENT_ULPS`` (4) epsilons times ``|cpu| + scale``
  (``scale``: the output's largest magnitude), so a few values gone wrong (a mask, one row) are
  caught where the RMS would dilute them, while a value near zero, where a reduction's cancellation
  makes rounding large relative to the value, is judged at the output's scale;

and a non-finite value where the other side has another (inf or nan against a number) is always
wrong. Integer and boolean outputs (indices, masks, argmax) must be equal. Reported:
``max_abs_error`` (``max |device - cpu|``) and ``max_rel_error`` (that over the output's scale, as
the debug notebook's module comparison measures a module's output).

**What is the CPU's output?** The same operator on the CPU (``replay``), except for the fused
attention kernels (``FUSED_ATTENTION``: CUDA's flash, memory-efficient and cuDNN attention, a
backend's overrideable one), which the CPU has no kernel of: those are replayed through the math
attention from the same query, key, value, mask, scale and causality (``attention_reference``), in
float32 as a fused kernel accumulates, and judged on the attention's output and its logsumexp; the
outputs no CPU attention makes (sequence offsets and lengths, random-number state, a debug mask) are
named as not judged (``NotJudged``), never counted as agreeing. An operator the CPU cannot run at
all makes ``replay`` raise: its caller says it was not judged.
"""

import hashlib
import io
import math
import os
import sys

#: The epsilon a floating output of each dtype is judged by (see the module docstring).
EPSILON = {"bfloat16": 2**-7, "float16": 2**-10, "float32": 2**-13, "float64": 2**-23}
#: Matrix products, judged in float32 at bf16's epsilon: a TPU's default precision for them is one
#: bf16 pass.
MATMULS = frozenset(
    {
        "aten::mm",
        "aten::bmm",
        "aten::addmm",
        "aten::baddbmm",
        "aten::addbmm",
        "aten::convolution",
        "aten::_convolution",
    }
)
#: The relative RMS error, in epsilons, above which a whole output is wrong.
NORM_ULPS = 1.5
#: The error of one value, in epsilons of ``|cpu| + scale``, above which an output is wrong.
ELEMENT_ULPS = 4.0
#: Operators whose output is not a function of their inputs (uninitialised memory, random numbers):
#: run, never judged.
NOT_REPLAYED = frozenset(
    {
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
        "aten::set_",
        "aten::bernoulli",
        "aten::bernoulli_",
        "aten::native_dropout",
        "aten::normal",
        "aten::normal_",
        "aten::uniform_",
        "aten::exponential_",
        "aten::multinomial",
        "aten::rand",
        "aten::rand_like",
        "aten::randn",
        "aten::randn_like",
        "aten::randint",
        "aten::randint_like",
        "aten::randperm",
    }
)
#: The fused attention kernels, replayed through the math attention where the CPU cannot run them
#: (``attention_reference``); the CPU runs the last itself.
FUSED_ATTENTION = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_fused_attention_overrideable",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
    }
)
#: Why a fused attention's other outputs are not judged.
NO_CPU_OUTPUT = (
    "no CPU attention makes them: sequence offsets and lengths, random-number state, a debug mask"
)
#: How an inputs file marks what is not a plain value: a tensor that was on the device (its CPU copy
#: inside), the device itself, a memory format (which pickle cannot save).
ON_DEVICE, DEVICE, MEMORY_FORMAT = "__on_device__", "__device__", "__memory_format__"


def tolerance_text():
    """The tolerances in one sentence (what a result and a script say they judged by)."""
    return (
        f"an output is wrong when its relative RMS error exceeds {NORM_ULPS:g} epsilons of its "
        f"dtype, one value's error exceeds {ELEMENT_ULPS:g} epsilons of (its value + the "
        "output's scale), or a non-finite value differs (epsilons: bfloat16 2^-7, float16 "
        "2^-10, float32 2^-13 and its matrix products 2^-7, float64 2^-23); integers must be "
        "equal"
    )


def _map(fn, tree):
    """``tree`` (an operator's arguments or result: tuples, lists, dicts) with every leaf
    replaced by ``fn`` of it."""
    if type(tree) in (tuple, list):
        return type(tree)(_map(fn, item) for item in tree)
    if type(tree) is dict and not _marker(tree):
        return {key: _map(fn, item) for key, item in tree.items()}
    return fn(tree)


def _leaves(tree, into):
    if type(tree) in (tuple, list):
        for item in tree:
            _leaves(item, into)
    elif type(tree) is dict:
        for item in tree.values():
            _leaves(item, into)
    else:
        into.append(tree)
    return into


def _marker(value):
    return (
        type(value) is dict
        and len(value) == 1
        and next(iter(value)) in (ON_DEVICE, DEVICE, MEMORY_FORMAT)
    )


def encode(tree, device_type, copy=True):
    """An operator's arguments as the CPU keeps them: every tensor on the CPU (``copy``: a copy,
    also of a CPU tensor, as an in-place operator's inputs must be kept before it writes), a
    device tensor marked ``ON_DEVICE``, the device (``device=``) marked ``DEVICE``, a memory
    format by its name; what ``torch.save`` writes and ``place`` puts back."""
    import torch

    def leaf(value):
        if isinstance(value, torch.Tensor):
            kept = value.detach().to("cpu", copy=copy)
            return {ON_DEVICE: kept} if value.device.type == device_type else kept
        if isinstance(value, torch.device) and value.type == device_type:
            return {DEVICE: value.index}
        if isinstance(value, torch.memory_format):
            return {MEMORY_FORMAT: str(value).removeprefix("torch.")}
        return value

    return _map(leaf, tree)


def place(tree, device=None, fresh=True):
    """``encode``'s arguments ready for a call: on ``device`` what was on the device, or
    everything on the CPU (``device`` None: the reference's replay); with ``fresh`` every CPU
    tensor a copy, so a call may write into it (an in-place operator's replay), without it the
    kept tensors themselves (an operator that writes nothing)."""
    import torch

    def tensor(value):
        return value.clone() if fresh else value

    def leaf(value):
        if _marker(value):
            ((kind, inner),) = value.items()
            if kind == MEMORY_FORMAT:
                return getattr(torch, inner)
            if kind == DEVICE:
                return torch.device("cpu") if device is None else device
            return tensor(inner) if device is None else inner.to(device, copy=True)
        if isinstance(value, torch.Tensor):
            return tensor(value)
        return value

    return _map(leaf, tree)


def describe(encoded):
    """(shapes, dtypes) of the tensors among an operator's ``encode``d arguments, in argument
    order."""
    import torch

    tensors = []
    for value in _leaves(encoded, []):
        tensor = value.get(ON_DEVICE) if type(value) is dict else value
        if isinstance(tensor, torch.Tensor):
            tensors.append(tensor)
    return [list(t.shape) for t in tensors], [_name(t.dtype) for t in tensors]


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def epsilon(dtype, name=None):
    """The epsilon an output of ``dtype`` made by operator ``name`` is judged by (see the module
    docstring)."""
    dtype = _name(dtype)
    if dtype == "float32" and name in MATMULS:
        return EPSILON["bfloat16"]
    return EPSILON.get(dtype, EPSILON["float32"])


def _judge_tensor(device, cpu, name):
    """One output tensor of each side (the device's already on the CPU): the errors, and why it
    is wrong (None)."""
    import torch

    if tuple(device.shape) != tuple(cpu.shape) or device.dtype != cpu.dtype:
        return (
            math.inf,
            math.inf,
            math.inf,
            (
                f"shape {list(device.shape)} {_name(device.dtype)} on the device, "
                f"{list(cpu.shape)} {_name(cpu.dtype)} on the CPU"
            ),
        )
    # most outputs of a faithful stack: nothing to measure
    if not device.numel() or torch.equal(device, cpu):
        return 0.0, 0.0, 0.0, None
    exact = not (device.is_floating_point() or device.is_complex())
    if device.is_complex():
        device, cpu = torch.view_as_real(device), torch.view_as_real(cpu)
    d, c = device.to(torch.float64), cpu.to(torch.float64)
    finite_d, finite_c = torch.isfinite(d), torch.isfinite(c)
    both = finite_d & finite_c
    odd = int((~both & ~((d == c) | (torch.isnan(d) & torch.isnan(c)))).sum())
    diff = (d[both] - c[both]).abs()
    ref = c[both].abs()
    max_abs = float(diff.max()) if diff.numel() else 0.0
    scale = float(ref.max()) if ref.numel() else 0.0
    max_rel = 0.0 if max_abs == 0.0 else (max_abs / scale if scale > 0.0 else math.inf)
    norm = float(c[both].norm()) if diff.numel() else 0.0
    rms_rel = 0.0 if max_abs == 0.0 else (float(diff.norm()) / norm if norm > 0.0 else math.inf)
    if odd:
        return (
            max_abs,
            max_rel,
            rms_rel,
            f"{odd} value(s) non-finite on one side only, or different non-finite",
        )
    if exact:
        wrong = max_abs > 0.0
        return (
            max_abs,
            max_rel,
            rms_rel,
            (f"{int((diff > 0).sum())} value(s) differ (integers)" if wrong else None),
        )
    eps = epsilon(device.dtype, name)
    if rms_rel > NORM_ULPS * eps:
        return (
            max_abs,
            max_rel,
            rms_rel,
            (
                f"relative RMS error {rms_rel:.3g} > {NORM_ULPS * eps:.3g} ({NORM_ULPS:g} x "
                f"2^{round(math.log2(eps))})"
            ),
        )
    beyond = int((diff > ELEMENT_ULPS * eps * (ref + scale)).sum())
    if beyond:
        return (
            max_abs,
            max_rel,
            rms_rel,
            (
                f"{beyond} value(s) off by more than {ELEMENT_ULPS:g} x "
                f"2^{round(math.log2(eps))} x (value + scale)"
            ),
        )
    return max_abs, max_rel, rms_rel, None


class NotJudged:
    """In a reference, an output the CPU's replay cannot make (a fused attention's random-number
    state): ``judge`` names it and compares nothing, so it never counts as agreeing."""

    def __init__(self, output, why):
        self.output, self.why = output, why

    def __repr__(self):
        return f"<{self.output}: not judged>"


def replay(op, args, kwargs, device_out=None):
    """Operator ``op`` on the CPU from the device's inputs (``args`` and ``kwargs`` placed on the
    CPU): the reference its device output (``device_out``, on the CPU) is judged against. A fused
    attention kernel the CPU has no kernel of is replayed through the math attention
    (``attention_reference``); any other operator the CPU cannot run raises, and its caller says
    it was not judged."""
    try:
        return op(*args, **kwargs)
    except Exception:
        if op._schema.name not in FUSED_ATTENTION:
            raise
    return attention_reference(op, args, kwargs, device_out)


def _bound(op, args, kwargs):
    """An operator's arguments by their names in its schema, the defaults filled in: the fused
    attention kernels take the same inputs in different places (the mask is ``attn_bias`` or
    ``attn_mask``, or absent)."""
    bound = {}
    for index, argument in enumerate(op._schema.arguments):
        if index < len(args):
            bound[argument.name] = args[index]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
    return bound


def attention_reference(op, args, kwargs, device_out=None):
    """A fused attention kernel's outputs as the CPU computes them from the same inputs (its
    arguments on the CPU): the attention's output through the math attention
    (``aten::_scaled_dot_product_attention_math``) in float32, as a fused kernel accumulates,
    rounded to the query's dtype; its logsumexp (the natural log of the sum over the keys of the
    exponentiated scaled, masked scores) where ``device_out``'s has one value per query; every
    other output ``NotJudged``. Raises where no reference exists (dropout draws random numbers)."""
    import torch

    bound = _bound(op, args, kwargs)
    if bound.get("dropout_p"):
        raise ValueError(
            f"dropout {bound['dropout_p']} draws random numbers: there is no reference to replay"
        )
    query, key, value = bound["query"], bound["key"], bound["value"]
    mask = bound.get("attn_bias", bound.get("attn_mask"))
    wide = torch.float64 if query.dtype == torch.float64 else torch.float32
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(wide)
    query, key, value = (t.to(wide) for t in (query, key, value))
    causal, scale = bool(bound.get("is_causal")), bound.get("scale")
    grouped = key.shape[-3] != query.shape[-3]
    output = torch.ops.aten._scaled_dot_product_attention_math(
        query, key, value, mask, 0.0, causal, None, scale=scale, enable_gqa=grouped
    )[0].to(bound["query"].dtype)
    names = [r.name for r in op._schema.returns]
    device = _leaves(device_out, []) if device_out is not None else []
    lse = _logsumexp(query, key, mask, causal, scale, device[1] if len(device) > 1 else None)
    return (output, lse, *(NotJudged(name, NO_CPU_OUTPUT) for name in names[2:]))


def _logsumexp(query, key, mask, causal, scale, device_lse):
    """The attention's logsumexp, one value per query, shaped as ``device_lse`` holds it (an
    empty one: not computed on the device either); ``NotJudged`` where it holds something else
    (padded), or where a query sees no key (what a kernel writes for it differs)."""
    import math

    import torch

    if device_lse is not None and isinstance(device_lse, torch.Tensor) and device_lse.numel() == 0:
        return torch.empty_like(device_lse)
    groups = query.shape[-3] // key.shape[-3]
    key = key.repeat_interleave(groups, dim=-3) if groups > 1 else key
    scores = (
        query @ key.transpose(-2, -1) * (1 / math.sqrt(query.shape[-1]) if scale is None else scale)
    )
    if causal:
        seen = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~seen, -math.inf)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    if not torch.isfinite(lse).all():
        return NotJudged(
            "logsumexp", "a query sees no key, and kernels write different values for it"
        )
    if device_lse is None or not isinstance(device_lse, torch.Tensor):
        return lse
    if tuple(device_lse.shape) == tuple(lse.shape) + (1,):
        lse = lse.unsqueeze(-1)
    if tuple(device_lse.shape) != tuple(lse.shape):
        return NotJudged(
            "logsumexp", f"shape {list(device_lse.shape)} on the device, not one value per query"
        )
    return lse.to(device_lse.dtype)


def judge(device_out, cpu_out, name=None):
    """Operator ``name``'s output on the device (every tensor in it already on the CPU) against
    the CPU's: a dict with ``wrong``, ``reason`` (the first wrong output's), ``max_abs_error``,
    ``max_rel_error`` and ``rms_rel_error`` (the worst over the outputs), and ``not_judged``
    ({output: why} of the reference's ``NotJudged`` outputs). See the module docstring for the
    tolerances."""
    import torch

    found = {
        "wrong": False,
        "reason": None,
        "max_abs_error": 0.0,
        "max_rel_error": 0.0,
        "rms_rel_error": 0.0,
    }
    found["not_judged"] = {}
    device_leaves, cpu_leaves = _leaves(device_out, []), _leaves(cpu_out, [])
    if len(device_leaves) != len(cpu_leaves):
        return {
            **found,
            "wrong": True,
            "reason": f"{len(device_leaves)} outputs on the device, {len(cpu_leaves)} on the CPU",
        }
    for d, c in zip(device_leaves, cpu_leaves):
        if isinstance(c, NotJudged):
            found["not_judged"][c.output] = c.why
            continue
        if isinstance(d, torch.Tensor) and isinstance(c, torch.Tensor):
            max_abs, max_rel, rms_rel, reason = _judge_tensor(d, c, name)
        elif isinstance(d, float) and isinstance(c, float):
            max_abs = (
                abs(d - c)
                if math.isfinite(d) and math.isfinite(c)
                else (0.0 if str(d) == str(c) else math.inf)
            )
            max_rel = rms_rel = 0.0 if max_abs == 0.0 else (max_abs / abs(c) if c else math.inf)
            reason = (
                f"{d!r} on the device, {c!r} on the CPU"
                if max_rel > ELEMENT_ULPS * EPSILON["float32"]
                else None
            )
        else:
            same = type(d) is type(c) and d == c
            max_abs = max_rel = rms_rel = 0.0 if same else math.inf
            reason = None if same else f"{d!r} on the device, {c!r} on the CPU"
        found["max_abs_error"] = max(found["max_abs_error"], max_abs)
        found["max_rel_error"] = max(found["max_rel_error"], max_rel)
        found["rms_rel_error"] = max(found["rms_rel_error"], rms_rel)
        if reason and not found["wrong"]:
            found.update(wrong=True, reason=reason)
    return found


def unjudged_outputs(not_judged):
    """``judge``'s ``not_judged`` in words, the outputs grouped by why: "rng_state, unused
    (why)"."""
    by_why = {}
    for output, why in not_judged.items():
        by_why.setdefault(why, []).append(output)
    return "; ".join(f"{', '.join(outputs)} ({why})" for why, outputs in by_why.items())


def to_cpu(out):
    """An operator's output with every tensor copied to the CPU (a device's output, to be
    judged)."""
    import torch

    return _map(
        lambda value: value.detach().to("cpu") if isinstance(value, torch.Tensor) else value, out
    )


def operator(name, overload):
    """The callable ``torch.ops`` overload: ``operator("aten::bmm", "default")`` is
    ``torch.ops.aten.bmm.default``."""
    import torch

    namespace, _, base = name.partition("::")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload)


def read_inputs(path, sha256):
    """An inputs file, only when its bytes hash to ``sha256``; tensors loaded with
    ``weights_only=True`` (a pickle of anything else is refused, so a file someone swapped cannot
    run code)."""
    import torch

    with open(path, "rb") as handle:
        data = handle.read()
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise ValueError(f"{path} has sha256 {found}, not {sha256}: not this operator's inputs")
    return torch.load(io.BytesIO(data), weights_only=True)


def run_script(settings, argv, set_up_backend):
    """The one-operator script: the operator on the device and on the CPU from the saved inputs,
    both outputs printed, then the verdict. Exit status 1 while they differ beyond the tolerance,
    0 when they agree, 2 with one sentence where this stack cannot run it (the device or its
    backend not here). ``set_up_backend``: the repro scripts' own (``reproduce``), which sets the
    stack's backend configuration as it ran (or not: ``--stack-as-found``), loads its backend and
    says why the device is not here."""
    # set, not defaulted: a parent may hand down torch_tpu's "1"
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    argv, why = set_up_backend(settings, argv)
    if why:
        print(f"no verdict: {why}", file=sys.stderr)
        return 2
    import torch

    folder = os.path.dirname(os.path.abspath(argv[0]))
    name = settings["inputs_sha256"] + ".pt"
    candidates = (
        [argv[1]]
        if len(argv) > 1
        else [os.path.join(folder, name), os.path.join(folder, "inputs", name)]
    )
    path = next((p for p in candidates if os.path.exists(p)), None)
    if path is None:
        return (
            f"the inputs file {name} is not beside this script: pass its path, python {argv[0]} "
            f"/path/to/{name}"
        )
    inputs = read_inputs(path, settings["inputs_sha256"])
    op = operator(settings["operator"], settings["overload"])
    device = torch.device(settings["device"])
    with torch.inference_mode():  # as the model ran
        on_device = to_cpu(op(*place(inputs["args"], device), **place(inputs["kwargs"], device)))
        on_cpu = replay(op, place(inputs["args"]), place(inputs["kwargs"]), on_device)
    found = judge(on_device, on_cpu, settings["operator"])
    torch.set_printoptions(precision=6, threshold=64, edgeitems=3)
    print(
        f"{settings['operator']}.{settings['overload']} on {device} (in "
        f"{settings['module']}):\n{on_device}"
    )
    print(f"{settings['operator']}.{settings['overload']} on the CPU:\n{on_cpu}")
    print(
        f"max_abs_error {found['max_abs_error']:.6g}, max_rel_error {found['max_rel_error']:.6g}, "
        f"rms_rel_error {found['rms_rel_error']:.6g}: "
        + (f"WRONG: {found['reason']}" if found["wrong"] else "they agree within the tolerance")
        + (f"; not judged: {unjudged_outputs(found['not_judged'])}" if found["not_judged"] else "")
    )
    return 1 if found["wrong"] else 0
