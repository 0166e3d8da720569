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

# Both cores (pytest-xdist), one test file per worker at a time (module fixtures built once), one
# intra-op thread each: two workers with torch's default threads oversubscribe a 2-core machine.
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

test: $(STAMP)
	$(PYTEST)

# The edit loop's subset (a few minutes): everything but the tests marked slow in tests/conftest.py.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

bench: $(STAMP)
	$(PY) tools/bench.py

clean:
	rm -rf runs .pytest_cache
