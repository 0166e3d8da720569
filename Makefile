# The two commands of the README: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.segadv-installed

.PHONY: demo test test-fast install bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev,export]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/segadv-train --run-dir runs/demo

test: $(STAMP)
	$(PY) -m pytest -q

# The edit loop's subset (a few minutes): everything but the tests marked slow in tests/conftest.py.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) tools/bench.py

clean:
	rm -rf runs .pytest_cache
