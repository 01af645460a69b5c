# Every target creates the virtual environment (.venv) when it is missing.
# torch is pinned to 2.13.0: it installs from local disk here, a bare `torch` pulls a multi-GB CUDA build.
PY        := .venv/bin/python
KERNEL_CONFIG := etc/ipython/ipython_kernel_config.py
STAMP     := .venv/.installed-$(shell cat pyproject.toml pretend/pyproject.toml constraints.txt $(KERNEL_CONFIG) | cksum | cut -d' ' -f1)
DATA      ?= data
PARAMS    ?= params/smoke.yaml
WORKERS   ?= 2
# 3 test workers on 2 cores: the suite waits as well as computes (kernel starts, rank timeouts, Ray's start), and a
# third worker fills those waits: 24.4 min with 3, 29.1 with 2 on the tree before (~5 CPU-minutes more), 2026-12-07.
TEST_WORKERS ?= 3
XDIST     = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
export PYTHONWARNINGS ?= ignore:<TorchTpu/Performance/TcMalloc/

.PHONY: setup venv lock lock-lab fixtures sweep nightly test suite test-fast lint bench mutation lab browser clean-data

setup: venv fixtures browser

venv: $(STAMP)

$(STAMP): pyproject.toml pretend/pyproject.toml constraints.txt $(KERNEL_CONFIG)
	@test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@# the pretend accelerator (test code, its own distribution): for the tests and the porting demo
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e pretend
	@# a venv built before JupyterLab moved to .venv-lab keeps its server stack (slow imports): drop it
	@$(PY) -m pip uninstall -q -y jupyterlab jupyterlab-server jupyter-server jupyter-lsp jupyter-events notebook-shim rfc3987-syntax >/dev/null 2>&1 || true
	@# the kernel's configuration (IPython reads {sys.prefix}/etc/ipython): no TCP warning from a plain papermill run
	@mkdir -p .venv/etc/ipython && cp $(KERNEL_CONFIG) .venv/etc/ipython/
	@rm -f .venv/.installed-*
	@touch $@

# constraints.txt: a fresh resolve of '.[dev]' (newest releases within pyproject's ranges), frozen. Then `make test`.
lock:
	rm -rf .venv-lock && python3 -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
	.venv-lock/bin/python -m pip install -q --disable-pip-version-check -e '.[dev,mutation]'
	{ grep '^#' constraints.txt; .venv-lock/bin/python -m pip freeze --exclude-editable | sed 's/^torch==.*/torch==2.13.0/' | sort -f; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .venv-lock

# constraints-lab.txt: the same for JupyterLab's venv (`make lab`): a fresh resolve of jupyterlab, frozen.
lock-lab:
	rm -rf .venv-lock && python3 -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --disable-pip-version-check jupyterlab
	{ grep '^#' constraints-lab.txt; .venv-lock/bin/python -m pip freeze | sort -f; } > constraints-lab.txt.new
	mv constraints-lab.txt.new constraints-lab.txt && rm -rf .venv-lock

fixtures: $(STAMP)
	PYTHONPATH=tests $(PY) -m fixtures.build --dir $(DATA)/models

# The main job: sweep the offline default model list on the local device, then render its report.
sweep: fixtures
	.venv/bin/model-support sweep $(PARAMS) --data-dir $(DATA) --workers $(WORKERS)

# The nightly (docs/nightly.md): the sweep, its gate against the last sweep of the same name and device, JUnit and
# Markdown, a bisect and a drafted bug report per regression; exit status 1 when the gate fails. NIGHTLY_ARGS: more
# options (--fail-on regressions,new-failures,perf, --expect FILE, --push REPO_ID, --find-links DIR).
nightly: fixtures
	.venv/bin/model-support nightly $(PARAMS) --data-dir $(DATA) --workers $(WORKERS) $(NIGHTLY_ARGS)

# Debian's Chromium for the browser tests (a test never downloads a browser).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null)

# Lint: ruff (lint + format), the import contracts (.importlinter: the package's rooms) and the type
# checker (mypy, configured in pyproject.toml).
lint: $(STAMP)
	.venv/bin/ruff check src tests bench pretend
	.venv/bin/ruff format --check src tests bench pretend
	.venv/bin/lint-imports --no-cache
	.venv/bin/mypy

# The whole suite: lint beside the tests (make -j2: lint's one core would leave the other idle before the tests),
# unit tests, real sweeps and notebooks, the browser tests, on TEST_WORKERS pytest-xdist workers (tests sharing a
# module or session fixture, the smoke sweep's, run on one worker: tests/conftest.py groups them, so each is built
# once). TEST_WORKERS=0: one process, no xdist.
test: fixtures browser $(STAMP)
	@$(MAKE) --no-print-directory -j2 lint suite

suite:
	$(PY) -m pytest -q $(XDIST)

# Unit tests and the quick real probes (no sweeps, no browser), on the same workers as `make test`.
test-fast: fixtures
	$(PY) -m pytest -q -m "not slow" $(XDIST)

bench: fixtures browser
	$(PY) bench/run_all.py

# Mutation testing (bench/mutation.py; cosmic-ray, the `mutation` extra, pinned in constraints.txt): each rule of the
# modules that decide answers broken on purpose, one mutant at a time, in a scratch copy (MUTATION_DIR, outside the
# work tree), and their fast tests run against it; the report, survivors and why, is bench/mutation.md. Slow (hours on
# a busy 2-core machine): never in `make test` or CI. MUTATION_ARGS: --only decision, --resume, --recheck, --report-only.
MUTATION_DIR ?= $(or $(TMPDIR),/tmp)/model-support-mutation
mutation: $(STAMP)
	@$(PY) -c "import cosmic_ray" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[mutation]'
	$(PY) bench/mutation.py --scratch $(MUTATION_DIR) $(MUTATION_ARGS)

# JupyterLab at the data folder: open any executed probe notebook and re-run it top to bottom.
# JupyterLab and its server stack live in their own venv (.venv-lab), out of what runs a probe (its
# dependencies slow `import papermill` by seconds); the notebooks run on the project's kernel
# (.venv's python, registered in .venv-lab as "python3"). --allow-root: containers run as root. Every version
# is locked by constraints-lab.txt (`make lock-lab` renews it); .venv-lab is installed again only when it changes.
LAB_PORT ?= 8888
LAB_VENV ?= .venv-lab
LAB_STAMP := $(LAB_VENV)/.installed-$(shell cksum < constraints-lab.txt | cut -d' ' -f1)
lab: fixtures $(LAB_STAMP)
	$(PY) -m ipykernel install --prefix $(LAB_VENV) --name python3 --display-name "model-support (.venv)" >/dev/null
	$(LAB_VENV)/bin/jupyter lab --notebook-dir=$(DATA) --no-browser --ip=127.0.0.1 --port=$(LAB_PORT) --allow-root

$(LAB_STAMP): constraints-lab.txt
	@test -x $(LAB_VENV)/bin/python || python3 -m venv $(LAB_VENV)
	$(LAB_VENV)/bin/python -m pip install -q --disable-pip-version-check -c constraints-lab.txt jupyterlab
	@rm -f $(LAB_VENV)/.installed-*
	@touch $@

clean-data:
	rm -rf $(DATA)/sweeps $(DATA)/results $(DATA)/excluded $(DATA)/reports $(DATA)/README.md
