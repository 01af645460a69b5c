"""Failure signatures must group by cause, not by model; redaction must leave no token behind."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from model_support.probe.signatures import MAX_SIGNATURE_LEN, failure_place, failure_signature
from model_support.redact import redact

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Real error messages with group labels (docs/design.md, "Failure signatures").
ERROR_SAMPLES = REPO_ROOT / "tests" / "data" / "error_samples.jsonl"


@pytest.fixture(scope="module")
def error_samples() -> list[dict]:
    """Every labelled sample; a missing file is a broken checkout, so fail rather than skip."""
    if not ERROR_SAMPLES.is_file():
        pytest.fail(f"error samples not found at {ERROR_SAMPLES}")
    rows = [json.loads(line) for line in ERROR_SAMPLES.read_text().splitlines() if line.strip()]
    assert rows, f"{ERROR_SAMPLES} is empty"
    return rows


def test_same_group_iff_same_signature(error_samples):
    """Same cause on different models gives one signature; different causes never share one."""
    sigs = [failure_signature(r["error_type"], r["message"]) for r in error_samples]
    for (a, sa), (b, sb) in itertools.combinations(zip(error_samples, sigs), 2):
        same_group = a["group"] == b["group"]
        assert same_group == (sa == sb), f"{a['group']} vs {b['group']}:\n  {sa}\n  {sb}"


def test_samples_give_bounded_deterministic_signatures(error_samples):
    for r in error_samples:
        sig = failure_signature(r["error_type"], r["message"])
        assert sig and len(sig) <= MAX_SIGNATURE_LEN
        assert sig == failure_signature(r["error_type"], r["message"])


def test_placeholders_for_hex_paths_urls():
    sig = failure_signature(
        "RuntimeError",
        "bad object <Foo at 0x7f3a2b1c9d> from /home/me/models/x.bin, see "
        "https://example.com/a?b=1.",
    )
    assert sig == "RuntimeError: bad object <Foo at <hex>> from <path>, see <url>."


def test_windows_and_relative_paths_are_placeholders():
    a = failure_signature("OSError", r"cannot open C:\Users\me\model.bin")
    b = failure_signature("OSError", "cannot open ./weights/shard.bin")
    assert a == b == "OSError: cannot open <path>"


def test_numbers_and_sizes_do_not_split_signatures():
    a = failure_signature("OutOfMemoryError", "Tried to allocate 14.00 MiB on GPU 0 after 3 steps")
    b = failure_signature("OutOfMemoryError", "Tried to allocate 2 GiB on GPU 7 after 12 steps")
    assert a == b == "OutOfMemoryError: Tried to allocate <size> on GPU <n> after <n> steps"


def test_one_device_mismatch_is_one_signature_whatever_the_order_of_its_devices():
    template = (
        "Expected all tensors to be on the same device, but found at least two devices, {} and "
        "{}! (when ...)"
    )
    a = failure_signature("RuntimeError", template.format("cpu", "cuda:0"))
    b = failure_signature("RuntimeError", template.format("cuda:1", "cpu"))
    tpu = failure_signature("RuntimeError", template.format("tpu:0", "cpu"))
    assert a == b and "cpu and cuda:<n>!" in a
    assert tpu != a and "cpu and tpu:<n>!" in tpu


def test_different_operator_gives_different_signature():
    template = "Could not run '{}' with arguments from the 'XLA' backend."
    a = failure_signature("NotImplementedError", template.format("aten::_sparse_coo_tensor"))
    b = failure_signature("NotImplementedError", template.format("aten::nonzero"))
    assert a != b and "aten::nonzero" in b and "'XLA' backend" in b


def test_memory_space_and_words_stay():
    sig = failure_signature(
        "XlaRuntimeError", "Ran out of memory in memory space vmem. Used 3.1M of 2M vmem."
    )
    assert (
        sig
        == "XlaRuntimeError: Ran out of memory in memory space vmem. Used <size> of <size> vmem."
    )


def test_repo_ids_model_types_configs_and_quoted_names():
    assert failure_signature("ValueError", "Loading meta-llama/Llama-2-7b needs it") == (
        "ValueError: Loading <repo> needs it"
    )
    assert "selective/custom" in failure_signature("E", "the selective/custom build")
    a = failure_signature("ValueError", "has model type `gemma2` but no `trust_remote_code=True`")
    assert a == "ValueError: has model type `<model_type>` but no `trust_remote_code=True`"
    b = failure_signature("ValueError", "Unrecognized <class 'transformers.T5Config'> or MT5Config")
    assert b == "ValueError: Unrecognized <config> or <config>"
    assert failure_signature("KeyError", "'llama'") == failure_signature("KeyError", "'qwen2'")
    assert failure_signature("KeyError", "can't find 'x'") == "KeyError: can't find '<name>'"


def test_only_first_line_counts_and_long_messages_are_bounded():
    head = "Model type should be one of"
    a = failure_signature("ValueError", f"{head}\nBartConfig, BertConfig")
    assert a == f"ValueError: {head}"
    long_sig = failure_signature("ValueError", "word " * 100_000)
    assert len(long_sig) <= MAX_SIGNATURE_LEN and long_sig.startswith("ValueError: word word")


@pytest.mark.parametrize(
    ("error_type", "message", "expected"),
    [
        (None, None, None),
        ("", "", None),
        ("  ", "\n\n", None),
        ("ValueError", None, "ValueError"),
        ("torch.cuda.OutOfMemoryError", "", "OutOfMemoryError"),
        (None, "boom 42", "boom <n>"),
    ],
)
def test_missing_parts(error_type, message, expected):
    assert failure_signature(error_type, message) == expected


def test_http_status_is_kept():
    """401 (gated) and 429 (rate limited) are different causes even under one error type."""
    a = failure_signature("HfHubHTTPError", "401 Client Error for url x")
    b = failure_signature("HfHubHTTPError", "429 Client Error for url x")
    assert a != b


FAKE_TOKEN = "hf_" + "abcdefghijklmnopqrstuvwxyzABCD"


def test_redact_removes_token_shape(monkeypatch):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    assert redact(f"Authorization: Bearer {FAKE_TOKEN}.") == "Authorization: Bearer ***."


def test_redact_removes_env_token_values(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "plain-secret-value-123")
    monkeypatch.setenv("HUGGINGFACE_HUB_TOKEN", "other-secret-value-456")
    out = redact("token=plain-secret-value-123 and other-secret-value-456")
    assert out == "token=*** and ***"


def test_redact_passes_none_and_empty_and_plain_text(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "1")  # too short to be a token: must not wreck the text
    assert redact(None) is None
    assert redact("") == ""
    assert redact("step 1 of 10") == "step 1 of 10"


def test_signature_never_carries_a_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "plain-secret-value-123")
    sig = failure_signature("ValueError", f"bad token {FAKE_TOKEN} / plain-secret-value-123")
    assert FAKE_TOKEN not in sig and "plain-secret-value-123" not in sig


# --- Places: where the error was raised (docs/design.md, "Failure signatures"; signatures.py
# docstring) ---
#
# The tracebacks below are real: tiny random transformers models (a few thousand weights, built from
# a config, no download) are run so that they fail in the places the architecture zoo showed, and
# the tracebacks are formatted as records store them (probe_core.trimmed_traceback) and in full.

SIZE_MISMATCH = (
    "RuntimeError: The size of tensor a (<n>) must match the size of tensor b (<n>) at "
    "non-singleton dimension <n>"
)
ROPE_LLAMA = "modeling_llama.apply_rotary_pos_emb"
SDPA = "sdpa_attention.sdpa_attention_forward"

#: Failing code in a model's custom code (trust_remote_code): transformers copies it into its
#: dynamic modules cache, .../huggingface/modules/transformers_modules/<owner>/<repo>/<commit>/.
CUSTOM_MODELING = """
import torch


def apply_rotary_pos_emb(q, cos):
    return q * cos


def forward(seq_len, rope_len):
    return apply_rotary_pos_emb(torch.ones(1, 2, seq_len, 4), torch.ones(1, 1, rope_len, 4))
"""


def _capture(call) -> dict:
    """Run ``call``, which must fail; its error as a probe record would hold it. The traceback
    starts at ``call``'s frame, as a record's starts at the probe's own (project) frame."""
    from model_support.probe.probe_core import trimmed_traceback

    try:
        call()
    except Exception as exc:  # noqa: BLE001 - every failure is what is being captured
        exc.__traceback__ = exc.__traceback__.tb_next  # drop this helper's frame
        import traceback as tb

        return {
            "error_type": type(exc).__name__,
            "message": str(exc),
            "full": "".join(tb.format_exception(type(exc), exc, exc.__traceback__)),
            "trimmed": trimmed_traceback(exc),
        }
    raise AssertionError("the call was expected to fail")


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> dict[str, dict]:
    """Name -> captured failure of a tiny random model (or of torch / custom code alone)."""
    import importlib.util
    import types
    from functools import partial

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from model_support.probe import probe_core

    torch.manual_seed(0)

    def tiny(model_type, **sizes):
        kw = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
        kw.update(intermediate_size=64, vocab_size=100)
        config = AutoConfig.for_model(model_type, **{**kw, **sizes})
        return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()

    def forward(model, seq_len, **kwargs):
        with torch.no_grad():
            return model(torch.randint(2, 100, (1, seq_len)), **kwargs)

    def wrong_positions(model, seq_len, n_positions):
        """Rotary tables for fewer positions than tokens: q * cos fails in apply_rotary_pos_emb."""
        return lambda: forward(model, seq_len, position_ids=torch.arange(n_positions)[None])

    def wrong_mask(model, seq_len, kv_len):
        """A 4D mask for another key length: scaled_dot_product_attention fails in
        sdpa_attention_forward."""
        return lambda: forward(
            model, seq_len, attention_mask=torch.ones(1, 1, seq_len, kv_len, dtype=torch.bool)
        )

    llama = tiny("llama")
    # internlm3 is another model type (its own config class) whose causal LM is LlamaForCausalLM.
    internlm3 = tiny(
        "internlm3",
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,
    )
    assert (
        type(internlm3).__module__
        == type(llama).__module__
        == "transformers.models.llama.modeling_llama"
    )
    deepseek = tiny(
        "deepseek_v3",
        rope_interleave=True,
        first_k_dense_replace=1,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=8,
        v_head_dim=8,
        moe_intermediate_size=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
    )
    custom_file = (
        tmp_path_factory.mktemp("hf")
        / "modules/transformers_modules/acme/TinyLM/0a1b2c3d/modeling_acme.py"
    )
    custom_file.parent.mkdir(parents=True)
    custom_file.write_text(CUSTOM_MODELING)
    spec = importlib.util.spec_from_file_location(
        "transformers_modules.acme.TinyLM.modeling_acme", custom_file
    )
    custom = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(custom)
    tokenizer = types.SimpleNamespace(pad_token_id=0, eos_token_id=1)
    ids = torch.tensor([[5, 6, 7]])

    def caught_then_torch_fails():
        try:
            wrong_positions(llama, 5, 3)()
        except RuntimeError:
            torch.nn.Embedding(3, 2)(torch.tensor([7]))

    calls = {
        "llama_rope": wrong_positions(llama, 5, 3),
        "internlm3_rope": wrong_positions(internlm3, 9, 4),
        "mistral_rope": wrong_positions(tiny("mistral"), 5, 3),
        "deepseek_v3_rope": wrong_positions(deepseek, 5, 3),
        "llama_sdpa": wrong_mask(llama, 5, 7),
        "qwen2_sdpa": wrong_mask(tiny("qwen2", hidden_size=64, num_attention_heads=8), 6, 11),
        "custom_rope": lambda: custom.forward(5, 3),
        # Through the probe's own generate(), as a probe runs it: project frames outermost (a
        # partial adds no frame of this file).
        "generate_4d_mask": partial(
            probe_core.generate, llama, tokenizer, ids, torch.ones(1, 1, 3, 3), 2, "cpu"
        ),
        "generate_token_id": partial(
            probe_core.generate, llama, tokenizer, ids * 50, torch.ones_like(ids), 2, "cpu"
        ),
        "generate_not_a_model": partial(
            probe_core.generate, torch.nn.Linear(2, 2), tokenizer, ids, ids, 2, "cpu"
        ),
        "torch_only": partial(torch.nn.Embedding(3, 2), torch.tensor([7])),
        "chained": caught_then_torch_fails,
    }
    return {name: _capture(call) for name, call in calls.items()}


EXPECTED_PLACES = {
    "llama_rope": ROPE_LLAMA,
    "internlm3_rope": ROPE_LLAMA,
    "mistral_rope": "modeling_mistral.apply_rotary_pos_emb",
    "deepseek_v3_rope": "modeling_deepseek_v3.apply_rotary_pos_emb_interleave",
    "llama_sdpa": SDPA,
    "qwen2_sdpa": SDPA,
    "custom_rope": "modeling_acme.apply_rotary_pos_emb",
    "generate_4d_mask": "utils.generate",  # transformers/generation/utils.py
    "generate_token_id": "modeling_llama.forward",  # the embedding lookup in LlamaModel.forward
    "generate_not_a_model": None,  # only project code and torch's module plumbing
    "torch_only": "functional.embedding",  # no transformers frame: the innermost other one
    "chained": "functional.embedding",  # the last exception's frames only, not its cause's
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PLACES))
@pytest.mark.parametrize("form", ["full", "trimmed"])
def test_live_places(live, name, form):
    assert failure_place(live[name][form]) == EXPECTED_PLACES[name]


def test_live_tracebacks_are_real_and_some_are_trimmed(live):
    for failure in live.values():
        assert failure["full"].startswith("Traceback (most recent call last):")
        assert (
            failure["full"]
            .rstrip()
            .endswith(f"{failure['error_type']}: {failure['message']}".rstrip())
        )
    assert any("lines trimmed" in f["trimmed"] for f in live.values())
    assert "lines trimmed" in live["llama_rope"]["trimmed"]
    assert "During handling of the above exception" in live["chained"]["full"]


def test_places_carry_no_line_numbers_and_no_paths(live):
    for name, failure in live.items():
        place = failure_place(failure["trimmed"])
        if place is None:
            continue
        assert re.fullmatch(r"[A-Za-z_]\w*\.(?:\w+|<\w+>)", place), place
        stem, func = place.split(".", 1)
        frames = [line for line in failure["full"].splitlines() if f'/{stem}.py", line ' in line]
        line_number = re.search(r", line (\d+), in (.+)$", frames[-1])
        assert line_number.group(2) == func and line_number.group(1) not in place, (
            name,
            frames[-1],
        )


def test_same_error_same_function_same_signature(live):
    """Different models, sizes and numbers in the message; the same error in the same function."""
    for a, b in [("llama_rope", "internlm3_rope"), ("llama_sdpa", "qwen2_sdpa")]:
        assert live[a]["message"] != live[b]["message"]
        for form in ("full", "trimmed"):
            sig_a = failure_signature(live[a]["error_type"], live[a]["message"], live[a][form])
            sig_b = failure_signature(live[b]["error_type"], live[b]["message"], live[b][form])
            assert sig_a == sig_b
    assert failure_signature(
        live["llama_rope"]["error_type"],
        live["llama_rope"]["message"],
        live["llama_rope"]["trimmed"],
    ) == (f"{SIZE_MISMATCH} @ {ROPE_LLAMA}")
    assert failure_signature(
        live["qwen2_sdpa"]["error_type"], live["qwen2_sdpa"]["message"], live["qwen2_sdpa"]["full"]
    ) == (f"{SIZE_MISMATCH} @ {SDPA}")


def test_same_words_from_different_functions_differ(live):
    names = ["llama_rope", "mistral_rope", "deepseek_v3_rope", "llama_sdpa", "custom_rope"]
    wordless = {failure_signature(live[n]["error_type"], live[n]["message"]) for n in names}
    assert wordless == {SIZE_MISMATCH}  # without a traceback they all read the same
    placed = [
        failure_signature(live[n]["error_type"], live[n]["message"], live[n]["trimmed"])
        for n in names
    ]
    assert len(set(placed)) == len(names), placed
    for name, sig in zip(names, placed):
        assert sig.endswith(f" @ {EXPECTED_PLACES[name]}") and len(sig) <= MAX_SIGNATURE_LEN
    # The longest place leaves no room for the whole message: the message is cut, not the place.
    assert (
        placed[2]
        == SIZE_MISMATCH.rsplit(" ", 2)[0]
        + " @ modeling_deepseek_v3.apply_rotary_pos_emb_interleave"
    )


def test_place_is_kept_when_the_message_is_cut(live):
    trace = live["deepseek_v3_rope"]["trimmed"]
    place = EXPECTED_PLACES["deepseek_v3_rope"]
    sig = failure_signature("RuntimeError", "word " * 10_000, trace)
    assert (
        len(sig) <= MAX_SIGNATURE_LEN
        and sig.endswith(f"word @ {place}")
        and sig.startswith("RuntimeError: word")
    )
    long_place = "modeling_" + "x" * 300
    text = (
        "Traceback (most recent call last):\n  File "
        f'"/v/site-packages/transformers/{long_place}.py", line 3, in f\nE: e'
    )
    assert len(failure_signature("E", "e " * 200, text)) <= MAX_SIGNATURE_LEN


def test_no_traceback_keeps_the_old_signature(error_samples):
    """The labelled samples have no traceback: their signatures are the ones from before places."""
    frozen = json.loads(
        (REPO_ROOT / "tests" / "data" / "error_samples_signatures.json").read_text()
    )
    assert [row["group"] for row in frozen] == [row["group"] for row in error_samples]
    for row, old in zip(error_samples, frozen):
        assert failure_signature(row["error_type"], row["message"]) == old["signature"]
        assert failure_signature(row["error_type"], row["message"], None) == old["signature"]
        assert failure_signature(row["error_type"], row["message"], "") == old["signature"]


def test_runner_records_and_plain_text_have_no_place(live):
    """Timeouts and dead kernels store a log tail, the download stage ``Type: message``: no place,
    even when the log tail happens to hold a printed traceback."""
    printed = live["llama_rope"]["full"]
    log_tail = (
        "(no traceback: the probe wrote no record)\n--- log tail ---\nExecuting cell "
        f"4\n{printed}\nKilled\n"
    )
    assert failure_place(log_tail) is None
    assert failure_place("GatedRepoError: 401 Client Error.") is None
    assert failure_place(None) is None and failure_place("") is None
    message = "the probe did not finish in 600 s"
    assert failure_signature("Timeout", message, log_tail) == failure_signature("Timeout", message)
    assert (
        failure_signature("Timeout", message, log_tail)
        == "Timeout: the probe did not finish in <n> s"
    )


@pytest.mark.parametrize(
    ("error_type", "message"),
    [
        (
            "OutOfMemoryError",
            "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 14.75 GiB total capacity)",
        ),
        (
            "RuntimeError",
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory",
        ),
        (
            "XlaRuntimeError",
            "RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 2.00G.",
        ),
        ("KeyboardInterrupt", ""),
        (
            "NotImplementedError",
            "Could not run 'aten::nonzero' with arguments from the 'XLA' backend.",
        ),
        (
            "NotImplementedError",
            "The operator 'aten::isin' is not currently implemented for the MPS device.",
        ),
        ("RuntimeError", "\"addmm_impl_cpu_\" not implemented for 'Half'"),
    ],
)
def test_incidental_places_are_left_out(live, error_type, message):
    """Out of memory, interrupts, an operator missing on a backend: the place would only split one
    cause by model file, so the signature stays the message-only one."""
    trace = live["llama_rope"]["trimmed"]
    assert failure_place(trace) == ROPE_LLAMA
    assert failure_signature(error_type, message, trace) == failure_signature(error_type, message)


def _frames(*files: tuple[str, str]) -> str:
    body = "".join(
        f'  File "{path}", line {10 + i}, in {func}\n    x()\n'
        for i, (path, func) in enumerate(files)
    )
    return f"Traceback (most recent call last):\n{body}RuntimeError: boom"


SP = "/opt/venv/lib/python3.12/site-packages"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        # Rule 1 wins over any inner frame of torch or another library.
        (
            [
                (f"{SP}/transformers/models/gpt2/modeling_gpt2.py", "forward"),
                (f"{SP}/torch/nn/functional.py", "linear"),
            ],
            "modeling_gpt2.forward",
        ),
        (
            [
                (
                    "/root/.cache/huggingface/modules/transformers_modules/o/r/abc/modeling_x.py",
                    "<module>",
                ),
                ("/usr/lib/python3.12/importlib/__init__.py", "import_module"),
            ],
            "modeling_x.<module>",
        ),
        # Rule 2: the innermost frame that is not stdlib, project, torch plumbing or notebook
        # runner.
        (
            [
                (f"{SP}/accelerate/hooks.py", "new_forward"),
                (f"{SP}/torch/nn/modules/module.py", "_call_impl"),
                ("/usr/lib/python3.12/contextlib.py", "__exit__"),
            ],
            "hooks.new_forward",
        ),
        (
            [
                ("/tmp/ipykernel_4242/1234567.py", "<module>"),
                (f"{SP}/papermill/execute.py", "execute_notebook"),
                ("/work/src/model_support/probe.py", "run"),
                ("<frozen runpy>", "_run_code"),
                ("<string>", "__init__"),
                (f"{SP}/torch/utils/_contextlib.py", "decorate_context"),
            ],
            None,
        ),
    ],
)
def test_place_rule_on_paths(files, expected):
    assert failure_place(_frames(*files)) == expected


def test_a_signature_cut_mid_word_ends_with_an_ellipsis():
    """A message longer than the signature holds is cut at a word boundary (the key it always
    had), or inside a word when that would lose over half: then it says it goes on. A column's
    cut always says so."""
    from model_support.probe.signatures import ELLIPSIS, shorten

    sig = failure_signature("RuntimeError", "failed at " + "x" * 300)
    assert sig == "RuntimeError: failed at " + "x" * (MAX_SIGNATURE_LEN - 25) + ELLIPSIS
    assert len(sig) == MAX_SIGNATURE_LEN
    words = failure_signature("RuntimeError", "a failure message about a backend " * 10)
    assert not words.endswith(ELLIPSIS) and words.split()[-1] in {
        "a",
        "failure",
        "message",
        "about",
        "backend",
    }
    assert len(words) <= MAX_SIGNATURE_LEN
    assert shorten("a failure message about a backend", 20) == "a failure message…"
    assert shorten("x" * 300, 20) == "x" * 19 + ELLIPSIS
    assert shorten("short enough", 20) == "short enough"
