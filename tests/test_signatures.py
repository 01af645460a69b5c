"""Failure signatures must group by cause, not by model; redaction must leave no token behind."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# The package lives under src/ and is not installed in every checkout; make it importable here.

from model_support.signatures import (  # noqa: E402
    MAX_SIGNATURE_LEN,
    failure_signature,
    redact,
)

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
        "bad object <Foo at 0x7f3a2b1c9d> from /home/me/models/x.bin, see https://example.com/a?b=1.",
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


def test_different_operator_gives_different_signature():
    template = "Could not run '{}' with arguments from the 'XLA' backend."
    a = failure_signature("NotImplementedError", template.format("aten::_sparse_coo_tensor"))
    b = failure_signature("NotImplementedError", template.format("aten::nonzero"))
    assert a != b and "aten::nonzero" in b and "'XLA' backend" in b


def test_memory_space_and_words_stay():
    sig = failure_signature("XlaRuntimeError", "Ran out of memory in memory space vmem. Used 3.1M of 2M vmem.")
    assert sig == "XlaRuntimeError: Ran out of memory in memory space vmem. Used <size> of <size> vmem."


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
