PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Two installs in one venv, each with its stamp: everything (make venv, for the suite), or only
# what the demo needs (make demo). The first holds the second: it stamps both.
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: venv demo lint check test bench torture chaos clean matrix matrix-venvs clean-matrix chromium slurm

venv: $(STAMP)

# The venv's packages are installed by uv, which pip installs into the venv first: the same
# versions as pip's, in half its time (make venv on a fresh clone: 34 s against pip's 73 s,
# measured back to back on 2 cores). --compile-bytecode, as pip does: under
# PYTHONDONTWRITEBYTECODE (set on this project's machines) every process would compile torch's
# modules again.
UV_VERSION := 0.13.9
# uv reads neither pip.conf nor PIP_* variables: pip's find-links, indexes and constraint files,
# as `pip config list` prints them (a value may hold several, on one line or on several: printed
# with "\n" between), go to uv as its options; uv takes
# the best version over all indexes, as pip does (unsafe-best-match; its default takes the first
# index that has the package). pip's cert and index-url (PIP_CERT, or pip.conf's) go as uv's
# --cert and --index-url, which uv takes once each: the last one listed, as pip takes its
# environment's over its files'.
PIP_CONFIG_AS_UV := $(PY) -m pip config list | awk -F "='" \
	'$$1 ~ /\.(cert|index-url)$$/ { sub(/^.*\./, "", $$1); sub(/'\''$$/, "", $$2); once[$$1] = $$2 } \
	$$1 ~ /\.(find-links|extra-index-url|constraint)$$/ { sub(/^.*\./, "", $$1); sub(/'\''$$/, "", $$2); \
	gsub(/\\n/, " ", $$2); n = split($$2, values, " "); for (i = 1; i <= n; i++) printf "--%s %s ", $$1, values[i] } \
	END { for (name in once) printf "--%s %s ", name, once[name] }'
UV := $(VENV)/bin/uv
# Named after the version: another UV_VERSION installs that one in an existing venv.
UV_STAMP := $(VENV)/.uv-$(UV_VERSION)
UV_INSTALL := $(UV) pip install -q --python $(PY) --compile-bytecode --index-strategy unsafe-best-match \
	$$($(PIP_CONFIG_AS_UV)) -c constraints.txt

$(PY):
	$(PYTHON) -m venv $(VENV)

# A rule of its own: a venv made before the installs went through uv gets it too.
$(UV_STAMP): | $(PY)
	$(PY) -m pip install -q uv==$(UV_VERSION)
	touch $(UV_STAMP)

# pip too (tests/test_wheel.py builds and installs a wheel with the venv's pip): the newest, as
# `pip install --upgrade pip` gave.
$(STAMP): pyproject.toml constraints.txt | $(UV_STAMP)
	$(UV_INSTALL) -e '.[test,libs,mpi,demo]' --upgrade-package pip pip
	# pytest-randomly for tests/report/test_report_edges.py, in a folder of its own: installed in the
	# venv, it would shuffle every pytest session of the suite.
	$(UV_INSTALL) --no-deps --target $(VENV)/randomly pytest-randomly
	touch $(STAMP) $(DEMO_STAMP)

# The demo extra (pyproject.toml): numpy and MPI, none of the training libraries.
$(DEMO_STAMP): pyproject.toml constraints.txt | $(UV_STAMP)
	$(UV_INSTALL) -e '.[demo]'
	touch $(DEMO_STAMP)

# The example suite: passing distributed tests and diagnosed failures.
demo: $(DEMO_STAMP)
	$(PY) examples/run_demo.py

# Headless Chromium for the test of the HTML report (tests/report/test_picture.py skips without it).
chromium:
	command -v chromium >/dev/null || (apt-get update && apt-get install -y chromium)

# SLURM and munge for the one-node cluster tests/launched/ starts (its tests skip, saying why,
# where it cannot be had: not root, or not installed).
slurm:
	command -v slurmctld >/dev/null || (apt-get update && apt-get install -y slurm-wlm munge)

# ruff and mypy, configured in pyproject.toml; both must be clean.
LINT := $(PY) -m ruff check . && $(PY) -m mypy
lint: venv
	$(LINT)

# A contributor's quick loop: the lint, then the tests that start no process (tests/conftest.py's
# CHECK_FILES: verdicts, wording, protocol, report text, layers), in seconds. make test runs all.
check: lint
	$(PY) -m pytest -q --check

# The plugin's own tests, after the lint, in 2 pytest-xdist workers (3 were no faster on 2
# cores: docs/benchmarks.md, "The project's own suite"), each test file in one worker (--dist
# loadfile): the tests of a file that read one shared session or set of controllers run where
# it ran, and it runs once. Files go out in the order tests/conftest.py gives them, the longest
# first (--no-loadscope-reorder: not by their number of tests). The 20 slowest tests close the
# output: where the suite's time goes, for whoever makes it shorter.
# The package's bytecode is compiled first: under PYTHONDONTWRITEBYTECODE (set on this project's
# machines) Python never caches it, so each of the suite's hundreds of processes that imports the
# plugin (sessions' controllers, forkservers, launched processes, MPI ranks) compiled it again:
# 0.1 to 0.2 s of CPU each. A stale one is recompiled in memory, never trusted.
# And pytest's own bytecode of the modules a controller imports: pytest rewrites the asserts of
# the plugin's package (a pytest11 plugin's) in each of its processes, into bytecode of its own,
# which it reads wherever it finds it but writes only without PYTHONDONTWRITEBYTECODE (0.25 s of
# CPU for each inner or launched session's pytest). A collection that starts nothing writes it
# (tests/conftest.py imports the controller), beside the lint (mypy keeps one core of two busy);
# the suite itself writes none, so a test file that an inner session writes twice within a second
# is never read from a stale copy.
test: venv
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -p no:cacheprovider --collect-only tests/test_layers.py \
	    >/dev/null 2>&1 & ($(LINT)); lint=$$?; wait $$!; exit $$lint
	$(PY) -m compileall -q pytest_ddp
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=20

# The plugin's own tests on each torch in MATRIX_TORCH, each in its own venv
# (.venv-torch<version>): the oldest release pyproject.toml's `torch>=` admits
# and the newest one tested (docs/torch-versions.md). constraints.txt's pin
# stays for `make test`; here a copy with the torch line replaced overrides it.
# Every version runs even if one fails; the target fails if any did.
# LOCK prefixes each suite run, e.g. make matrix LOCK='flock /tmp/ddp-heavy.lock'.
TORCH_MIN := $(shell sed -n 's/^ *"torch>=\([0-9.]*\).*/\1/p' pyproject.toml | awk -F. '{print $$1"."($$2==""?0:$$2)"."($$3==""?0:$$3)}')
MATRIX_TORCH ?= $(TORCH_MIN) 2.14.1
MATRIX_VENVS := $(foreach v,$(MATRIX_TORCH),.venv-torch$(v)/.installed)
LOCK ?=

matrix-venvs: $(MATRIX_VENVS)

.venv-torch%/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv .venv-torch$*
	.venv-torch$*/bin/python -m pip install -q --upgrade pip
	grep -v '^torch[=<>~! ]' constraints.txt > .venv-torch$*/constraints.txt
	echo 'torch==$*' >> .venv-torch$*/constraints.txt
	.venv-torch$*/bin/python -m pip install -q -c .venv-torch$*/constraints.txt -e '.[test]'
	.venv-torch$*/bin/python -c 'import torch, sys; v = torch.__version__.split("+")[0]; sys.exit(0 if v == "$*" else "torch " + v + " installed, not $*")'
	touch $@

matrix: $(MATRIX_VENVS)
	@failed=; for v in $(MATRIX_TORCH); do \
	    echo "== torch $$v"; \
	    $(LOCK) .venv-torch$$v/bin/python -m pytest -q -p no:cacheprovider || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "== failed on torch$$failed"; exit 1; fi; \
	echo "== passed on torch $(MATRIX_TORCH)"

clean-matrix:
	rm -rf .venv-torch*

bench: venv
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/recorder_overhead.py
	$(PY) benchmarks/verdict_scale.py --real

# The hostile run of "Nothing lost at the edges": prints what it left behind
# (nothing, or it fails). LOCK as for matrix, e.g. LOCK='flock /tmp/ddp-heavy.lock'.
torture: venv
	$(LOCK) $(PY) benchmarks/torture.py

# Random faults in thousands of small ddp tests under -n 4 (benchmarks/chaos.py; about an hour).
chaos: venv
	$(LOCK) $(PY) benchmarks/chaos.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
