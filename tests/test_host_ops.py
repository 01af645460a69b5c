"""Operators on the host (``model_support.probe.host_ops``, docs/host_ops.md): a kernel per named
operator registered through ``torch.library`` for the device's dispatch key, for one run, that
runs the operator on the CPU; the refusal, before anything runs, of the operators that cannot run
that way; and the pretend device honouring such a kernel as the dispatcher does for a C++
backend.

What runs on the pretend device runs in child processes (registering the device renames
PrivateUse1 for the life of a process, which the test process must not do); the refusals and the
adapters' declarations need no device."""

from __future__ import annotations

import json

import pytest
from test_pretend import child_json

from model_support.probe import host_ops
from model_support.probe.devices import adapter_for

#: On the pretend device, with rsqrt missing, gelu crashing and exp wrong: each on the host, then
#: not.
ON_THE_DEVICE = """
    import json
    import torch
    from model_support.probe.host_ops import on_host
    from model_support_pretend import load

    load()  # as torch's autoload would
    device = torch.device("pretend")
    has = lambda name: torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
    x_cpu = torch.tensor([[4.0, 16.0, 0.25], [1.0, 9.0, 2.0]])
    x = x_cpu.to(device)
    out = {}

    def failure(call):
        try:
            call()
        except NotImplementedError as exc:
            return str(exc).splitlines()[0]
        return None

    out["before"] = failure(lambda: torch.rsqrt(x))
    with on_host("pretend", ["aten::rsqrt", "aten::gelu", "aten::exp", "aten::mul_"]) as hosted:
        out["registered"] = has("aten::rsqrt") and has("aten::rsqrt.out")
        out["overloads"] = hosted.overloads
        out["rsqrt"] = torch.equal(torch.rsqrt(x).cpu(), torch.rsqrt(x_cpu))
        out["on_device"] = str(torch.rsqrt(x).device)
        given = torch.empty(2, 3, device=device)
        returned = torch.rsqrt(x, out=given)
        out["out"] = returned is given and torch.equal(given.cpu(), torch.rsqrt(x_cpu))
        y = x.clone()
        returned = y.mul_(x)
        out["in_place"] = returned is y and torch.equal(y.cpu(), x_cpu * x_cpu)
        z = x.clone()
        z[1].mul_(3.0)  # in place through a view: the device tensor's own storage is written
        expected = x_cpu.clone()
        expected[1] *= 3.0
        out["in_place_view"] = torch.equal(z.cpu(), expected)
        out["gelu"] = torch.equal(torch.nn.functional.gelu(x).cpu(), torch.nn.functional.gelu(x_cpu))
        out["exp"] = torch.equal(torch.exp(x).cpu(), torch.exp(x_cpu))
        out["calls"] = dict(hosted.calls)
    out["after"] = failure(lambda: torch.rsqrt(x))
    out["kernel_gone"] = not has("aten::rsqrt") and not has("aten::rsqrt.out")
    out["wrong_again"] = not torch.equal(torch.exp(x).cpu(), torch.exp(x_cpu))
    from model_support_pretend import tensor

    syncs, _, fallbacks = tensor.STATE.counters.read()
    out["syncs"], out["fallbacks"] = syncs, fallbacks

    # the mechanism itself, as the issue writes it: any kernel registered for the device's dispatch key
    library = torch.library.Library("aten", "IMPL")
    torch.library.register_kernel("aten::rsqrt", "pretend", lambda a: torch.rsqrt(a.cpu()).to(a.device), lib=library)
    out["register_kernel"] = torch.equal(torch.rsqrt(x).cpu(), torch.rsqrt(x_cpu))
    library._destroy()
    out["register_kernel_gone"] = failure(lambda: torch.rsqrt(x)) is not None
    print(json.dumps(out))
"""


def test_missing_crashing_and_wrong_operators_run_on_the_host_and_only_for_the_run():
    out = child_json(
        ON_THE_DEVICE,
        {"missing_ops": ["aten::rsqrt"], "crash_ops": ["aten::gelu"], "wrong_ops": ["aten::exp"]},
    )
    assert out["before"].startswith(
        "Could not run 'aten::rsqrt' with arguments from the 'pretend' backend."
    )
    assert out["registered"]
    assert (
        out["overloads"][:2] == ["aten::rsqrt", "aten::rsqrt.out"]
        and "aten::mul_.Tensor" in out["overloads"]
    )
    # the CPU's numbers, on the device; out= and in-place forms return the tensor they were given,
    # written
    assert out["rsqrt"] and out["on_device"] == "pretend:0"
    assert out["out"] and out["in_place"] and out["in_place_view"]
    assert out["gelu"], "a crashing operator on the host runs (the process is alive to say so)"
    assert out["exp"], "a wrong operator on the host gives the CPU's numbers"
    assert out["calls"] == {
        "aten::rsqrt": 2,
        "aten::rsqrt.out": 1,
        "aten::mul_.Tensor": 2,  # a Python number reaches a backend as a wrapped tensor
        "aten::gelu": 1,
        "aten::exp": 1,
    }
    # after the run: the kernels are gone, the stack's own faults are back
    assert out["after"] == out["before"] and out["kernel_gone"] and out["wrong_again"]
    # each host call is a CPU fallback on the device's own counters, its copies to the host syncs
    assert {op: out["fallbacks"][op] for op in out["calls"]} == out["calls"]
    assert out["syncs"] >= sum(out["calls"].values())
    assert out["register_kernel"] and out["register_kernel_gone"]


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("aten::empty", "it is a factory (no tensor input)"),
        ("aten::arange", "it is a factory (no tensor input)"),
        ("aten::randn", "it is a factory (no tensor input)"),
        ("aten::view", "it is a view (its result aliases an input)"),
        ("aten::transpose", "it is a view"),
        ("aten::as_strided", "it is a view"),
        ("aten::transpose_", "it changes a tensor's metadata in place"),
        ("aten::bernoulli", "it is a random operator"),
        ("aten::linear", "it is a composite that decomposes before it reaches a backend"),
        ("aten::matmul", "it is a composite that decomposes before it reaches a backend"),
        ("aten::copy_", "it is one of the copies between the device and the host"),
        ("aten::_to_copy", "it is one of the copies between the device and the host"),
        ("aten::_scaled_dot_product_flash_attention", "the CPU has no kernel for it"),
        ("aten::rsqrtt", "it is no operator torch knows"),
        ("rsqrt", "it is no operator torch knows"),
        # TorchScript's, on numbers: no backend receives it
        ("aten::add.int", "it is no operator torch knows"),
    ],
)
def test_what_cannot_run_on_the_host_is_refused_by_name_with_why(name, words):
    refused = host_ops.refusals([name, "aten::rsqrt", "aten::add.Tensor"])
    assert list(refused) == [name] and refused[name].startswith(words), refused
    with pytest.raises(host_ops.HostOpsRefused) as caught:
        host_ops.on_host("cpu", ["aten::rsqrt", name])
    assert str(caught.value).startswith(
        f"{name} cannot run on the host: {words}"
    ) and "\n" not in str(caught.value)
    assert caught.value.refused == refused


def test_a_packet_is_every_overload_that_can_go_and_names_those_that_cannot():
    """``aten::add`` covers its overloads on tensors (not TorchScript's on numbers);
    ``aten::linear`` is refused by its default overload, the one models call, though its out=
    form could go."""
    hosted = host_ops.on_host("cpu", ["aten::add", "aten::rsqrt", "aten::rsqrt.out"])
    assert hosted.overloads == [
        "aten::add.Tensor",
        "aten::add.Scalar",
        "aten::add.out",
        "aten::add.Scalar_out",
        "aten::rsqrt",
        "aten::rsqrt.out",
    ]
    assert hosted.left_out == {} and hosted.key == "CPU"
    assert host_ops.refusals(["aten::linear.out"]) == {}
    assert host_ops.refusals(["aten::linear"])


def test_the_adapters_say_whether_their_backend_takes_host_kernels():
    assert adapter_for("cpu").host_kernels() == (
        False,
        "the cpu device is the host: its operators already run on the CPU",
    )
    for name in ("pretend", "cuda", "tpu", "xpu"):
        assert adapter_for(name).host_kernels() == (True, None), name


def test_the_operators_the_stack_lacks(monkeypatch):
    """The setting ``missing``: what the adapter's coverage says the stack lacks, every overload
    by its name."""
    monkeypatch.setenv(
        "MODEL_SUPPORT_PRETEND", json.dumps({"missing_ops": ["aten::rsqrt", "aten::gelu.out"]})
    )
    lacking = host_ops.lacking(adapter_for("pretend"))
    assert lacking == ["aten::gelu.out", "aten::rsqrt", "aten::rsqrt.out"]
    assert host_ops.refusals(lacking) == {}


#: Fixture models on a pretend stack that lacks rsqrt (a llama's RMSNorm calls it) and gelu
#: (GPT-NeoX's MLP) and crashes in relu (OPT's MLP): the llama failing, then each model with those
#: operators on the host, against the CPU's tokens.
END_TO_END = """
    import json
    import torch
    from model_support.probe import devices, probe_core
    from model_support.probe.host_ops import on_host

    adapter = devices.resolve("pretend")
    def generate(model, device, sync=None):
        result = probe_core.run_stages(model_id=f"data/models/{model}", device=device, synchronize=sync)
        return {"status": result["status"], "error": str(result.get("exception") or "")[:200],
                "tokens": result.get("output_token_ids")}
    out = {"missing": generate("tiny-llama", adapter.torch_device, adapter.synchronize)}
    with on_host(adapter.type, ["aten::rsqrt", "aten::gelu", "aten::relu"]) as hosted:
        for model in ("tiny-llama", "tiny-gpt-neox", "tiny-opt"):
            out[model] = {"cpu": generate(model, torch.device("cpu")),
                          "hosted": generate(model, adapter.torch_device, adapter.synchronize)}
    out["calls"] = hosted.calls
    print(json.dumps(out))
"""


def test_models_the_stack_cannot_run_run_with_those_operators_on_the_host():
    out = child_json(
        END_TO_END, {"missing_ops": ["aten::rsqrt", "aten::gelu"], "crash_ops": ["aten::relu"]}
    )
    assert out["missing"]["status"] == "FAIL(gen)" and "aten::rsqrt" in out["missing"]["error"]
    for model in ("tiny-llama", "tiny-gpt-neox", "tiny-opt"):
        assert out[model]["cpu"]["status"] == "PASS", (model, out[model]["cpu"]["error"])
        assert out[model]["hosted"]["status"] == "PASS", (model, out[model]["hosted"]["error"])
        # the CPU's kernels, same dtype
        assert out[model]["hosted"]["tokens"] == out[model]["cpu"]["tokens"], model
    assert all(out["calls"].get(op, 0) > 0 for op in ("aten::rsqrt", "aten::gelu", "aten::relu")), (
        out["calls"]
    )
