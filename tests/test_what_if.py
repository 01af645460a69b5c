"""What-if runs (issue 48, parts 1 and 2): a sweep with ``host_ops`` runs the operators it names
on the host's CPU kernels, through kernels registered for the device's dispatch key
(``probe.host_ops``), and is never the stack's verdict: its rows are kept in the ``what_if``
config, and the gate, the exports, the support card and the ``results`` config read the same
before and after it.

On the pretend device whose ``aten::silu`` crashes (the process aborts, as a device runtime's
does): the stack's sweep fails tiny-llama (SiLU-gated MLP) and passes tiny-gpt2 (GELU); the
what-if sweep with silu on the host passes tiny-llama, its numbers checked against the CPU
reference, its host calls counted."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from helpers import REPO, pretend_cli
from model_support.errors import UserError

PRETEND = {"crash_ops": ["aten::silu"], "crash_message": False}
MODELS = [str(REPO / "data" / "models" / m) for m in ("tiny-llama", "tiny-gpt2")]
PROBE = {"device": "pretend", "max_new_tokens": 4, "judge": False, "perf": False}


def cli(args: list, data, check: bool = True) -> subprocess.CompletedProcess:
    done = pretend_cli(args, data, PRETEND)
    assert not check or done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def sweep(tmp, data, name: str, probe: dict, check: bool = True) -> subprocess.CompletedProcess:
    path = tmp / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump({"name": name, "probe": {**PROBE, **probe}, "models": MODELS, "workers": 2})
    )
    return cli(["sweep", str(path), "--no-report"], data, check)


def seen(data, sweep_id: str) -> dict:
    """What the stack's readers say of a sweep: its results rows, its exports, the support card
    of each model."""
    import polars as pl

    from model_support.analysis.support import support
    from model_support.record import store
    from model_support.render.exports import export

    rows = (
        store.scan(data, "results")
        .filter(pl.col("sweep_id") == sweep_id)
        .select("model_id", "status")
    )
    return {
        "results": sorted(rows.collect().rows()),
        "all_results": store.scan(data, "results").select(pl.len()).collect().item(),
        "junit": export(data, sweep_id, "junit"),
        "markdown": export(data, sweep_id, "markdown"),
        "support": {m: support(f"local:{m.rsplit('/', 1)[-1]}", data) for m in MODELS},
    }


@pytest.fixture(scope="module")
def what_if(tmp_path_factory, fixture_models) -> dict:
    from model_support.record import store

    tmp = tmp_path_factory.mktemp("what-if")
    data = tmp / "data"
    sweep(tmp, data, "stack", {})
    (stack,) = store.list_sweeps(data)
    before = seen(data, stack)
    # asked, and still not timed
    done = sweep(tmp, data, "silu-on-host", {"host_ops": "aten::silu", "perf": "on"})
    (hosted,) = [s for s in store.list_sweeps(data) if s != stack]
    return {
        "tmp": tmp,
        "data": data,
        "stack": stack,
        "hosted": hosted,
        "before": before,
        "after": seen(data, stack),
        "said": done.stdout,
    }


def test_the_stack_crashes_where_the_what_if_run_passes_with_silu_on_the_host(what_if):
    import polars as pl

    from model_support.record import store

    data = what_if["data"]
    stack = dict(what_if["before"]["results"])
    assert stack["local:tiny-llama"].startswith("FAIL") and stack["local:tiny-gpt2"] == "PASS", (
        stack
    )
    rows = store.scan(data, "what_if").filter(pl.col("sweep_id") == what_if["hosted"]).collect()
    llama = rows.filter(pl.col("model_id") == "local:tiny-llama").row(0, named=True)
    assert llama["status"] == "PASS" and llama["what_if"] is True and llama["numerics"] == "match"
    assert llama["host_ops"] == "aten::silu" and "aten::silu" in llama["host_ops_run"]
    assert llama["host_op_names"] == ["aten::silu"] and llama["host_op_calls"][0] > 0
    assert llama["host_op_calls_per_token"] == llama["host_op_calls"][0] / llama["tokens_out"]
    assert llama["perf_note"].startswith("not measured: a what-if run (host_ops)")
    gpt2 = rows.filter(pl.col("model_id") == "local:tiny-gpt2").row(0, named=True)
    assert (
        gpt2["status"] == "PASS"
        and gpt2["host_op_names"] == []
        and gpt2["host_op_calls_per_token"] == 0
    )


def test_a_what_if_run_is_never_the_stacks_verdict(what_if):
    """The results config holds no row of the what-if sweep, and what the gate, the exports and
    the support card say of the stack is what they said before it ran."""
    import polars as pl

    from model_support.record import store

    data, before, after = what_if["data"], what_if["before"], what_if["after"]
    assert (
        store.scan(data, "results").filter(pl.col("sweep_id") == what_if["hosted"]).collect().height
        == 0
    )
    assert after == before  # results rows, JUnit, Markdown and every support card, unchanged
    assert all(
        "PASS" not in str(card) or "tiny-gpt2" in name for name, card in after["support"].items()
    )
    # the newest sweep of the stack, not the what-if
    assert store.resolve_sweep_id(data, "latest") == what_if["stack"]
    # latest never names one, even of its own name
    with pytest.raises(UserError, match="is a what-if sweep"):
        store.resolve_sweep_id(data, "latest:silu-on-host")
    # its id (a prefix) does
    assert store.resolve_sweep_id(data, what_if["hosted"][:-2]) == what_if["hosted"]
    done = cli(
        ["diff", what_if["stack"], what_if["hosted"], "--fail-on", "regressions"], data, check=False
    )
    assert (
        done.returncode != 0
        and f"Sweep {what_if['hosted']} is a what-if sweep" in done.stderr + done.stdout
    )


@pytest.mark.parametrize(
    ("asked", "said"),
    [
        (
            "aten::empty.memory_format",
            "aten::empty.memory_format cannot run on the host: it is a factory",
        ),
        ("aten::silu,aten::view", "aten::view cannot run on the host: it is a view"),
    ],
)
def test_an_operator_that_cannot_go_to_the_host_is_refused_by_name_before_anything_runs(
    what_if, asked, said
):
    from model_support.record import store

    data = what_if["data"]
    known = set(store.list_sweeps(data))
    done = sweep(what_if["tmp"], data, "refused", {"host_ops": asked}, check=False)
    assert done.returncode != 0 and said in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and set(store.list_sweeps(data)) == known  # nothing ran


def test_a_what_if_sweep_is_refused_where_it_would_pass_for_the_stacks(what_if):
    """Review's findings: host_ops in one model's overrides (a sweep mixing what-if runs with the
    stack's), a nightly of a what-if definition, the repro script of a what-if run (it would run
    the stack's own kernels) are one sentence each; ``list`` counts a what-if sweep's runs apart
    from the stack's verdicts."""
    import yaml

    from model_support.record import store

    tmp, data = what_if["tmp"], what_if["data"]
    known = set(store.list_sweeps(data))
    mixed = tmp / "mixed.yaml"
    models = [MODELS[0], {"id": MODELS[1], "overrides": {"host_ops": "aten::silu"}}]
    mixed.write_text(yaml.safe_dump({"name": "mixed", "probe": PROBE, "models": models}))
    done = cli(["sweep", str(mixed), "--no-report"], data, check=False)
    assert done.returncode != 0 and "host_ops is set in the overrides of" in done.stderr, (
        done.stderr[-1500:]
    )
    night = tmp / "night.yaml"
    night.write_text(
        yaml.safe_dump(
            {"name": "night", "probe": {**PROBE, "host_ops": "aten::silu"}, "models": MODELS}
        )
    )
    done = cli(["nightly", str(night), "--no-report", "--no-bisect"], data, check=False)
    assert done.returncode != 0 and "a nightly cannot gate it" in done.stderr, done.stderr[-1500:]
    assert set(store.list_sweeps(data)) == known  # nothing ran
    done = cli(
        ["repro", what_if["hosted"], "tiny-llama", "--variant", "eager+dynamic+4t"],
        data,
        check=False,
    )
    assert done.returncode != 0 and "as a what-if run (host_ops='aten::silu'" in done.stderr, (
        done.stderr[-1500:]
    )
    done = cli(["export", what_if["hosted"], "--format", "junit"], data, check=False)
    assert done.returncode != 0 and "is a what-if sweep (operators on the host)" in done.stderr, (
        done.stderr[-1500:]
    )
    listed = {r["sweep_id"]: r for r in json.loads(cli(["list", "--json"], data).stdout)}[
        what_if["hosted"]
    ]
    # its own runs, no PASS of the stack
    assert listed["PASS"] == 0 and listed["what_if"]["PASS"] == 2, listed
    # run by hand
    assert listed["what_if"]["host_ops"] == "aten::silu" and listed["what_if"]["proves"] is None
    assert "what-if 2" in cli(["list"], data).stdout
    # no plan of its own: said, not empty
    said = " ".join(cli(["ops", what_if["hosted"]], data).stdout.split())
    assert said.startswith(
        f"Sweep {what_if['hosted']} is a what-if run with aten::silu on the host"
    ), said


def test_a_what_if_sweep_says_what_it_is_in_its_summary_and_its_own_report(what_if):
    """Its runs are read where they are kept (the ``what_if`` config): its report counts them,
    not "not tested", and says first that operators ran on the host; the sweep's summary says
    each verdict as a what-if one."""
    from model_support.analysis.report_tables import report_tables
    from model_support.render import report
    from model_support.render.html import header_html

    assert "what-if PASS: 2  what-if FAIL(load): 0" in what_if["said"], what_if["said"][-2000:]
    assert (
        f"dataset:  {what_if['data'] / 'what_if'} (what-if runs: no verdict of the stack)"
        in what_if["said"]
    )
    tables = report_tables(what_if["data"], what_if["hosted"])
    assert tables["summary"]["models"][0] == 2 and tables["not_tested"].height == 0
    assert tables["what_if"]["host_ops"].to_list() == ["aten::silu"]
    head = header_html(tables, what_if["hosted"], None)
    assert (
        "<dt>what-if</dt>" in head
        and "host_ops: aten::silu" in head
        and "no verdict of the stack" in head
    )
    # no stack sweep is its baseline
    assert report.previous_sweep(what_if["data"], what_if["hosted"]) is None
    stack = report_tables(what_if["data"], what_if["stack"])
    # the stack's own: no what-if row in it
    assert "what_if" not in stack and stack["summary"]["models"][0] == 2


def test_the_explorer_shows_the_stacks_sweeps_and_no_what_if_one(what_if):
    """The explorer is the stack's history: a what-if sweep (its rows in its own config, its
    models listed in its definition) is no column of it, neither as runs nor as models "not
    tested" by it."""
    import shutil

    from model_support import analysis
    from model_support.record import store
    from model_support.render.explorer import explorer_data

    page = explorer_data(what_if["data"])
    shown = [row[0] for row in page["sweeps"]]
    assert what_if["stack"] in shown and what_if["hosted"] not in shown, shown
    # a dataset pulled without its definitions, with a what-if sweep's rows in results too (the
    # runner's stand-ins went there until review found it): their host_ops tell, the sweep is known
    # by them and shown by none
    pulled = what_if["tmp"] / "pulled"
    shutil.copytree(what_if["data"], pulled, ignore=shutil.ignore_patterns("sweeps", "reports"))
    hosted = f"sweep={what_if['hosted']}"
    shutil.copytree(pulled / "what_if" / hosted, pulled / "results" / hosted, dirs_exist_ok=True)
    assert what_if["hosted"] in analysis.sweep_index(pulled)["sweep_id"].to_list()
    assert store.host_ops_by_rows(pulled, [what_if["stack"], what_if["hosted"]]) == {
        what_if["hosted"]: "aten::silu"
    }
    shown = [row[0] for row in explorer_data(pulled)["sweeps"]]
    assert what_if["stack"] in shown and what_if["hosted"] not in shown, shown
