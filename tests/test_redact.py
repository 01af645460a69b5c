"""Secrets out of every stored field (``redact.redact_record``), generated from the record's
declaration: every text field and every list-of-text field (``rank_errors`` and
``graph_break_reasons`` carry error text) with a token in it comes back without it (issue 59,
item 5: the list branch deleted passed every test). And ``redact``'s rules at their edges: the
token shape's length, each token variable, the shortest value taken as a secret, machine paths
longest first."""

from __future__ import annotations

import json
import typing

import pytest

from model_support import redact as r
from model_support.record import schema

TOKEN = "hf_" + "A1b2C3d4E5f6G7h8I9j0" + "KlMn"  # the shape: hf_ and at least 20 letters or digits
SECRET = "a-plain-secret-value"  # a token variable's value that has no hf_ shape
HINTS = typing.get_type_hints(schema.Record)


def _texts(kind: type) -> list[str]:
    """The record's fields of a type: ``str`` or ``list[str]`` (optional or not)."""
    return sorted(n for n, t in HINTS.items() if kind in typing.get_args(t) or t == kind)


TEXT_FIELDS, LIST_FIELDS = _texts(str), _texts(list[str])


@pytest.fixture
def secret(monkeypatch) -> str:
    for name in r.TOKEN_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return SECRET


def test_the_record_has_text_and_list_of_text_fields_and_the_error_lists_are_among_them():
    assert {"rank_errors", "graph_break_reasons"} <= set(LIST_FIELDS)
    assert {"error_message", "traceback", "generated_text"} <= set(TEXT_FIELDS)


@pytest.mark.parametrize("name", LIST_FIELDS)
def test_every_list_of_text_field_loses_its_secrets_and_keeps_the_rest(secret, name):
    said = [
        f"rank 1: OSError: 401 for {TOKEN} at /home/me/models/tiny",
        f"token={secret}",
        "",
        "rank 2: fine",
    ]
    record = schema.empty_record(**{name: list(said)})
    # in place, the same object
    assert r.redact_record(record, {"/home/me/models/tiny": "local:tiny"}) is record
    assert record[name] == [
        "rank 1: OSError: 401 for *** at local:tiny",
        "token=***",
        "",
        "rank 2: fine",
    ]
    assert TOKEN not in json.dumps(record) and secret not in json.dumps(record)


@pytest.mark.parametrize("name", TEXT_FIELDS)
def test_every_text_field_loses_its_secrets(secret, name):
    record = schema.empty_record(**{name: f"{TOKEN} / {secret} / /home/me/models/tiny"})
    r.redact_record(record, {"/home/me/models/tiny": "local:tiny"})
    assert record[name] == "*** / *** / local:tiny"


def test_lists_in_lists_and_what_is_no_text_are_kept_as_they_are(secret):
    fields = {
        "nested": [[TOKEN, 3], None, [secret]],
        "count": 7,
        "share": 0.5,
        "none": None,
        "flag": True,
    }
    expected = {
        "nested": [["***", 3], None, ["***"]],
        "count": 7,
        "share": 0.5,
        "none": None,
        "flag": True,
    }
    assert r.redact_record(fields) == expected


def test_the_token_shape_is_hf_and_twenty_letters_or_digits(monkeypatch):
    for name in r.TOKEN_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    assert r.redact("hf_" + "a" * 20) == "***"
    # too short to be a token
    assert r.redact("x hf_" + "a" * 19 + " y") == "x hf_" + "a" * 19 + " y"
    assert r.redact("hf_" + "a" * 25 + "-rest") == "***-rest"


@pytest.mark.parametrize("name", r.TOKEN_ENV_VARS)
def test_each_token_variables_value_is_a_secret_from_eight_characters(monkeypatch, name):
    for other in r.TOKEN_ENV_VARS:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, "  eight-ch  ")  # read stripped
    assert r.redact("a eight-ch b") == "a *** b"
    monkeypatch.setenv(name, "seven-c")  # shorter values are left alone: "1" would wreck every text
    assert r.redact("a seven-c b") == "a seven-c b"
    assert set(r.TOKEN_ENV_VARS) == {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_HUB_TOKEN"}


def test_machine_paths_are_replaced_longest_first_and_an_empty_one_is_ignored(monkeypatch):
    for name in r.TOKEN_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    # by the path's length
    replace = {"/data": "the data folder", "/data/models/tiny": "local:tiny", "": "NOTHING"}
    assert (
        r.redact("load /data/models/tiny from /data", replace)
        == "load local:tiny from the data folder"
    )
    assert r.redact("", replace) == "" and r.redact(None, replace) is None
