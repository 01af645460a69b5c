"""What a new user met (issue 54): an exact model name refused as ambiguous, options that
conflict or do nothing taken silently, a data folder that is a file or missing, and cosmetics
that mislead (the diff's title, the explorer's ``lacks`` after ``ops --complete``, machine paths
in a report's tracebacks). Each built directly, no sweep runs: the commands run in-process
(click's runner), as typed."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from helpers import REPO
from model_support import cli
from model_support.errors import UserError
from model_support.probe import probe_params
from model_support.probe.model_ids import resolve
from model_support.probe.signatures import failure_place, portable_paths
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.render import explorer_rows, html, terminal
from model_support.sweep import definition
from model_support.sweep.definition import SweepConfigError

SWEEP = "smoke-20261205T000000Z-abcd"
GEMMAS = ["local:tiny-gemma", "local:tiny-gemma3"]
VARIANT = probe_params.variant({"device": "cpu"})


def make_sweep(
    data: Path, sweep_id: str = SWEEP, models=GEMMAS, compact: bool = True, **fields
) -> Path:
    """A sweep whose every model has its record (a complete one), compacted unless told not to."""
    meta = SweepMeta(
        sweep_id=sweep_id,
        name=sweep_id.split("-2026")[0],
        created_at="2026-12-05T00:00:00+00:00",
        probe={"device": "cpu"},
        models=[ModelEntry(m) for m in models],
        excluded={},
    )
    meta.write(store.sweep_dir(data, sweep_id))
    for model_id in models:
        record = schema.empty_record(
            sweep_id=sweep_id,
            model_id=model_id,
            variant=VARIANT,
            device_type="cpu",
            duration_s=1.0,
            **fields,
        )
        store.store_result(data, sweep_id, record, None, "")
    if compact:
        store.compact(data, sweep_id)
    return data


def typed(*args: str, env: dict | None = None):
    """``model-support ARGS`` as a user types it: (exit status, what it printed, stdout and
    stderr together)."""
    result = CliRunner().invoke(cli.main, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def files(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``folder``: its modification time and bytes."""
    return {
        str(p): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# --- 1. an exact name wins over a fragment
# ---------------------------------------------------------------------


def test_an_exact_name_wins_over_the_fragments_it_is_part_of():
    assert resolve(GEMMAS, "tiny-gemma", "s") == "local:tiny-gemma"  # not "matches 2 models"
    assert resolve(GEMMAS, "local:tiny-gemma", "s") == "local:tiny-gemma"
    assert resolve(GEMMAS, "local_tiny-gemma", "s") == "local:tiny-gemma"  # its file name
    assert resolve(GEMMAS, "TINY-GEMMA", "s") == "local:tiny-gemma"  # an exact name ignoring case
    assert resolve(GEMMAS, "gemma3", "s") == "local:tiny-gemma3"  # a unique fragment, as before
    hub = ["org/gpt2", "org/gpt2-medium", "other/gpt2-large"]
    assert resolve(hub, "gpt2", "s") == "org/gpt2"  # the name after its organisation
    with pytest.raises(UserError, match=r"^'tiny-gem' matches 2 models of s, give more of the id"):
        resolve(GEMMAS, "tiny-gem", "s")
    with pytest.raises(
        UserError,
        match=r"^'gpt2' is the name of 2 models of s; give the whole id: a/gpt2, b/gpt2\.$",
    ):
        resolve(["a/gpt2", "b/gpt2"], "gpt2", "s")


def test_support_repro_and_localise_take_the_exact_name(tmp_path, monkeypatch):
    data = make_sweep(tmp_path, status="PASS")
    status, out = typed("support", "tiny-gemma", "--json", "--data-dir", str(data))
    assert status == 0 and {card["sweep_id"] for card in json.loads(out)} == {SWEEP}, out
    status, out = typed("repro", SWEEP, "tiny-gemma", "--data-dir", str(data))
    # it got that far
    assert "matches 2 models" not in out and "local:tiny-gemma has no repro script" in out, out

    asked = []
    from model_support.debug import localise

    monkeypatch.setattr(
        localise, "localise", lambda data_dir, sweep_id, model, variant: asked.append(model) or {}
    )
    status, out = typed("localise", SWEEP, "tiny-gemma", "--json", "--data-dir", str(data))
    assert status == 0 and asked == ["local:tiny-gemma"], out


# --- 2. conflicting or wrong options are refused, in one sentence, before anything runs
# ---------------------------


def test_a_definition_file_and_resume_together_are_refused(tmp_path):
    data = make_sweep(tmp_path)
    before = files(data)
    status, out = typed(
        "sweep", str(REPO / "params/smoke.yaml"), "--resume", SWEEP, "--data-dir", str(data)
    )
    assert status == 2 and "not both" in out and "Traceback" not in out, out
    assert files(data) == before  # no sweep started, nothing written


def test_resuming_a_complete_sweep_says_so_and_rewrites_nothing(tmp_path):
    data = make_sweep(tmp_path)
    before = files(data)
    status, out = typed("sweep", "--resume", SWEEP, "--no-report", "--data-dir", str(data))
    assert status == 0 and f"sweep {SWEEP}: 0 probed now, 2 models: the sweep is complete" in out, (
        out
    )
    assert "nothing rewritten" in out
    assert files(data) == before
    (data / "reports").mkdir()
    # with --report: complete once it is there
    (data / "reports" / f"{SWEEP}.html").write_text("its report")
    before = files(data)
    status, out = typed("sweep", "--resume", SWEEP, "--data-dir", str(data))
    assert status == 0 and "nothing rewritten" in out and files(data) == before, out


def test_resuming_a_sweep_stopped_after_its_last_record_finishes_it(tmp_path):
    data = make_sweep(tmp_path, compact=False)  # stopped between its last record and its compaction
    status, out = typed("sweep", "--resume", SWEEP, "--no-report", "--data-dir", str(data))
    assert status == 0 and "0 probed now" in out and "the sweep is complete" not in out, out
    assert store.scan(data).filter(pl.col("sweep_id") == SWEEP).collect().height == 2


@pytest.mark.parametrize("name", ["bad/../x", "my sweep", "a" * 101])
def test_a_sweep_name_that_is_not_a_plain_name_is_refused(name):
    with pytest.raises(
        SweepConfigError, match=r"is not a plain name \(its sweep's id and folder would read"
    ):
        definition.parse({"name": name, "models": ["a"]}, source="t.yaml", base=REPO)
    assert (
        definition.parse({"name": "smoke-1.2_x", "models": ["a"]}, source="t.yaml", base=REPO).name
        == "smoke-1.2_x"
    )


@pytest.mark.parametrize("fmt", ["markdown", "csv", "json"])
def test_suspect_fails_outside_junit_is_refused(tmp_path, fmt):
    data = make_sweep(tmp_path, status="PASS")
    status, out = typed(
        "export", SWEEP, "--format", fmt, "--suspect-fails", "--data-dir", str(data)
    )
    assert status == 2 and "--suspect-fails applies to --format junit" in out, out
    status, out = typed(
        "export", SWEEP, "--format", "junit", "--suspect-fails", "--data-dir", str(data)
    )
    assert status == 0 and out.startswith("<?xml"), out


def test_a_data_folder_that_is_a_file_or_missing_is_named(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("")
    status, out = typed("list", "--data-dir", str(a_file))
    assert status == 2 and f"--data-dir {a_file} is a file, not a folder" in out, out
    status, out = typed("sweep", "params/smoke.yaml", "--data-dir", str(a_file))
    assert status == 2 and "is a file, not a folder" in out, out
    missing = tmp_path / "missing"
    status, out = typed("support", "x", "--data-dir", str(missing))
    assert (
        status == 2 and f"--data-dir {missing} does not exist" in out and "candidates" not in out
    ), out
    status, out = typed("report", "latest", "--data-dir", str(missing))
    assert (
        status == 2
        and f"There is no 'latest' sweep, since --data-dir {missing} does not exist" in out
    ), out
    status, out = typed("list", env={"MODEL_SUPPORT_DATA_DIR": str(missing)})
    assert status == 2 and f"$MODEL_SUPPORT_DATA_DIR ({missing}) does not exist" in out, out
    # a sweep creates it: only its own question
    status, out = typed("sweep", "--data-dir", str(missing))
    assert status == 2 and "Give a sweep definition" in out and not missing.exists(), out


# --- 3. cosmetics that mislead
# -----------------------------------------------------------------------------------


def test_the_diff_title_says_which_sweep_is_the_baseline(tmp_path):
    before, after = "smoke-20261205T000000Z-aaaa", "smoke-20261206T000000Z-bbbb"
    make_sweep(tmp_path, before, status="PASS")
    make_sweep(tmp_path, after, status="PASS")
    text = terminal.format_diff(tmp_path, before, after)  # `model-support diff BEFORE AFTER`
    assert f"{after} (on cpu) against {before} (on cpu), the baseline (given first)" in text, text


def test_the_explorer_lacks_every_operator_ops_complete_found(tmp_path):
    stack, what_if = "stack-20261205T000000Z-abcd", "stack-what-if-20261205T010000Z-abcd"
    llama = ["local:tiny-llama"]
    make_sweep(
        tmp_path,
        stack,
        llama,
        status="FAIL(gen)",
        attribution="stack",
        error_type="NotImplementedError",
        failure_stage="generate",
        error_message="Could not run 'aten::rsqrt' with arguments from the 'PrivateUse1' backend.",
        ops=["aten::mm", "aten::rsqrt"],
        ops_stages=["generate"] * 2,
        ops_calls=[4, 2],
        ops_source="partial",
        ops_missing=["aten::rsqrt"],  # the census of a stopped run: the operator that stopped it
    )
    SweepMeta(  # --complete's what-if sweep: every missing operator on the host, the run to its end
        sweep_id=what_if,
        name="stack-what-if",
        created_at="2026-12-05T01:00:00+00:00",
        probe={"device": "cpu", "host_ops": "missing"},
        models=[ModelEntry(llama[0])],
        excluded={},
    ).write(store.sweep_dir(tmp_path, what_if))
    run = schema.empty_record(
        sweep_id=what_if,
        model_id=llama[0],
        variant=VARIANT,
        device_type="cpu",
        status="PASS",
        numerics="match",
        what_if=True,
        host_ops="missing",
        host_ops_run=["aten::rsqrt", "aten::bmm"],
        ops=["aten::mm", "aten::rsqrt", "aten::bmm"],
        ops_stages=["generate"] * 3,
        ops_calls=[4, 2, 2],
        ops_source="run",
        ops_missing=["aten::rsqrt", "aten::bmm"],
    )
    store.store_result(tmp_path, what_if, run, None, "")
    store.compact(tmp_path, what_if)
    runs = [{"sweep_id": what_if, "host_ops": "missing", "models": llama, "purpose": "complete"}]
    (store.sweep_dir(tmp_path, stack) / "proof.json").write_text(
        json.dumps({"runs": runs, "steps": []})
    )
    unprobed = pl.DataFrame(
        schema=dict.fromkeys(
            ("model_id", "variant", "sweep_id", "status", "failure_signature"), pl.String
        )
    )
    _, _, outcomes, _ = explorer_rows.encoded_rows(
        tmp_path, pl.DataFrame({"sweep_id": [stack]}), unprobed
    )
    assert outcomes["lacks"].to_list() == ["aten::rsqrt, aten::bmm"]


TRACEBACK = """Traceback (most recent call last):
  File "/home/alice/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py", line 9, in forward
  File "/home/alice/.cache/huggingface/modules/transformers_modules/org/modeling_x.py", line 3, in attn
  File "/srv/checkout/src/model_support/probe/run.py", line 2, in run_probe
  File "/usr/lib/python3.11/json/decoder.py", line 337, in decode
  File "<frozen importlib._bootstrap>", line 1, in _call
OSError: /home/alice/models/x/config.json is missing (see https://hf.co/docs/a/b)"""


def test_a_reports_traceback_names_files_not_the_machine_that_ran_them():
    shown = portable_paths(TRACEBACK)
    assert shown.splitlines()[1:5] == [
        '  File "transformers/models/llama/modeling_llama.py", line 9, in forward',
        '  File "transformers_modules/org/modeling_x.py", line 3, in attn',
        '  File "model_support/probe/run.py", line 2, in run_probe',
        '  File "lib/python3.11/json/decoder.py", line 337, in decode',
    ]
    assert "<frozen importlib._bootstrap>" in shown and "https://hf.co/docs/a/b" in shown
    assert "alice" not in shown and "~/models/x/config.json" in shown
    # the record keeps what the signature reads
    assert failure_place(TRACEBACK) == "modeling_x.attn"
    # as the report's failure modes show it
    page = html.table_html(pl.DataFrame({"traceback": [TRACEBACK]}))
    assert "alice" not in page and "transformers/models/llama/modeling_llama.py" in page
