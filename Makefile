PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test,libs]'
	touch $(STAMP)

# The example suite: passing distributed tests and diagnosed failures.
demo: venv
	$(PY) examples/run_demo.py

# The plugin's own tests.
test: venv
	$(PY) -m pytest -q

bench: venv
	$(PY) -m pip install -q -c constraints.txt -e '.[test,libs,bench]'
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/recorder_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
