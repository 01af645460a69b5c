"""What tests share besides fixtures: real notebook runs, one-model probes and sweeps through the
CLI, an offline browser page. Imported as ``from helpers import ...`` (fixtures live in
conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The environment the shell gave pytest (conftest.py kept it before the test harness changed
#: anything): what a command a user types runs in.
SHELL_ENVIRON: dict[str, str] = json.loads(
    os.environ.get("MODEL_SUPPORT_TESTS_SHELL_ENV") or "{}"
) or dict(os.environ)
FAKE_TOKEN = "hf_" + "FakeTokenForLeakTests" + "x" * 16  # placed in HF_TOKEN during the smoke sweep
CHROMIUM = Path("/usr/bin/chromium")


def pretend_cli(
    args: list,
    data: Path,
    pretend: dict | None,
    *,
    check: bool = False,
    threads: int | None = None,
    timeout: int = 900,
) -> subprocess.CompletedProcess:
    """``model-support ARGS --data-dir DATA`` in a child process on the pretend device configured
    by ``pretend`` (``MODEL_SUPPORT_PRETEND``; registered only in that process, never in a test
    worker; None: unset, the pretend accelerator off). ``threads``: OMP_NUM_THREADS for the child
    (two test workers share two cores); ``check``: it must exit 0 (its output's tail is the
    assertion's message)."""
    import os

    env = {**os.environ}
    env.pop("MODEL_SUPPORT_PRETEND", None)
    if pretend is not None:
        env["MODEL_SUPPORT_PRETEND"] = json.dumps(pretend)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(
        [sys.executable, "-m", "model_support.cli", *args, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
    )
    if check:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def run_notebook(notebook: str, out: Path, **parameters) -> Path:
    """Execute one of the project's notebooks for real with papermill, as every notebook run of
    ours is (``engine.run_notebook``: an ipc kernel, shut down after); returns the output path."""
    from model_support.engine.notebooks import run_notebook as run

    return run(REPO / "notebooks" / notebook, out, parameters)


def stored_records(data: Path, sweep_id: str) -> list[dict]:
    """A sweep's stored records, each with its whole repro script put together again
    (``repro.script_of``: the row's settings and the body its ``repro_sha256`` names, kept once
    in the sweep's ``repro/``)."""
    from model_support.probe import repro
    from model_support.record import store

    bodies = store.repro_dir(data, sweep_id)
    return [
        {**r, "repro_script": repro.script_of(r, bodies)}
        for r in store.read_records(data, sweep_id)
    ]


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def probe_record(tmp_path: Path, model: str, **parameters) -> dict:
    """One real papermill probe of ``model`` on the CPU (no CPU reference unless asked); its
    record."""
    name = Path(model).name
    record_path = tmp_path / f"{name}.json"
    parameters = {"device": "cpu", "reference": "none", **parameters}
    run_notebook(
        "probe.ipynb",
        tmp_path / f"{name}.ipynb",
        model_id=model,
        record_path=str(record_path),
        **parameters,
    )
    return read_json(record_path)


def cli_debug(
    data: Path, path: str, probe: dict, matrix: dict, variant: str
) -> subprocess.CompletedProcess:
    """``model-support debug s <folder name> --variant VARIANT`` for real, on a one-model sweep
    ``s`` written under ``data`` with ``probe`` settings and ``matrix`` (nothing probed). The
    debug notebook, when it runs, is ``sweep_dir(data,
    "s")/debug/local_<folder>@<variant>.ipynb``."""
    from model_support.record import store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta

    name = Path(path).name
    meta = SweepMeta(
        sweep_id="s",
        name="s",
        created_at="2026-12-01T00:00:00+00:00",
        probe=probe,
        models=[ModelEntry(f"local:{name}", path)],
        matrix=matrix,
    )
    meta.write(store.sweep_dir(data, "s"))
    command = [sys.executable, "-m", "model_support.cli", "debug", "s", name, "--variant", variant]
    return subprocess.run(
        [*command, "--data-dir", str(data)], capture_output=True, text=True, timeout=900
    )


def cli_sweep(tmp_path: Path, definition: dict, *flags: str) -> tuple[Path, str]:
    """``model-support sweep`` on ``definition`` (written as YAML), for real, in a fresh data
    folder; (data folder, sweep id). Fails the test, with the command's stderr, when the sweep
    fails."""
    import yaml

    from model_support.record import store

    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(definition))
    data = tmp_path / "data"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "model_support.cli",
            "sweep",
            str(path),
            "--data-dir",
            str(data),
            *flags,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (sweep_id,) = store.list_sweeps(data)
    return data, sweep_id


def offline_page(browser):
    """A page that refuses every non-file request and records it (and any page error)."""
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    attempted, errors = [], []

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            attempted.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, attempted, errors


def assert_charts_drawn(page, min_charts: int, timeout_ms: int = 20000) -> None:
    """At least ``min_charts`` report charts, each with a rendered SVG of real size."""
    page.wait_for_function(
        f"document.querySelectorAll('.ms-chart svg').length >= {min_charts}", timeout=timeout_ms
    )
    charts = page.locator(".ms-chart")
    assert charts.count() >= min_charts
    for i in range(charts.count()):
        box = charts.nth(i).locator("svg").first.bounding_box()
        assert box and box["width"] > 50 and box["height"] > 50, f"chart {i} did not render"


def wait_count(page, n: int) -> None:
    """Wait until the explorer says ``n`` entries match its filters."""
    page.wait_for_function(f"document.querySelector('#match-count').textContent.startsWith('{n} ')")


def ready_made_sweep(
    data: Path, sweep_id: str, day: int, rows: dict[str, dict], defined=None, excluded=()
) -> None:
    """A sweep of ready-made records, for the gate and the diff: ``rows`` {model: the record's
    fields} (``status`` PASS unless given: a PASS matches the reference, a failure has a
    signature), ``defined`` its definition's models (``rows``' by default), ``excluded`` the
    models it excluded (an excluded row, the environment's doing)."""
    from model_support.record import schema, store
    from model_support.record.sweep_meta import ModelEntry, SweepMeta

    SweepMeta(
        sweep_id=sweep_id,
        name="nightly",
        created_at=f"2026-12-0{day}T00:00:00+00:00",
        probe={},
        models=[ModelEntry(m) for m in (rows if defined is None else defined)],
    ).write(store.sweep_dir(data, sweep_id))
    for model_id, fields in rows.items():
        status = fields.get("status", "PASS")
        record = schema.empty_record(
            sweep_id=sweep_id,
            model_id=model_id,
            failure_signature=None if status == "PASS" else "RuntimeError: boom",
            numerics="match" if status == "PASS" else None,
            **{"status": status, **fields},
        )
        store.store_result(data, sweep_id, record, None, "")
    for model_id in excluded:
        store.store_exclusion(data, sweep_id, model_id, "no access to the gated repo", "")
    store.compact(data, sweep_id)


def wait_until_blocked(
    thread, innermost: str, within: str | None = None, timeout: float = 60.0
) -> None:
    """Until ``thread`` is blocked where the test says it must wait: its innermost Python frame
    is the function ``innermost`` (a C call such as ``flock`` or a lock's ``acquire`` has none of
    its own), called from ``within`` when given. A wait observed, not a sleep guessed:
    ``sleep(0.2); assert not done`` passes on a busy host where the thread has not started yet,
    whatever the code does; here a thread that never blocks there (it ran through, or never got
    there) fails the test."""
    import time

    def where():
        frame = sys._current_frames().get(thread.ident)
        if frame is None or frame.f_code.co_name != innermost:
            return None
        at, names = (frame.f_code, frame.f_lasti), set()
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        return at if within is None or within in names else None

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = where()
        if at is not None:
            # still there, at the same instruction, a while later: blocked, not passing through
            time.sleep(0.05)
            if where() == at:
                return
        if not thread.is_alive():
            raise AssertionError(f"the thread ended without blocking in {innermost}")
        time.sleep(0.005)
    raise AssertionError(f"the thread did not block in {innermost} within {timeout:g} s")


class FakeClock:
    """A clock that moves only when told (``advance``): what a test asserts about time is then
    exact."""

    def __init__(self, at: float = 1000.0):
        self.at = at

    def __call__(self) -> float:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += seconds
