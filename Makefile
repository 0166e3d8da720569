# The two commands of the README: `make demo` and `make test`. Both create .venv when missing, with
# the newest releases pip finds; `make test-oldest` runs the fast subset on the floors instead.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.segadv-installed

.PHONY: demo test test-fast test-isa test-oldest install bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev,export]"
	$(PY) -m pip check
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/segadv-train --run-dir runs/demo

# Both cores (pytest-xdist), one test file per worker at a time (module fixtures built once), one
# intra-op thread each: two workers with torch's default threads oversubscribe a 2-core machine.
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

# The 30 slowest tests are listed at the end: the suite's 20-minute budget is spent there.
test: $(STAMP)
	$(PYTEST) --durations=30

# The edit loop's subset (a few minutes): everything but the tests marked slow in tests/conftest.py.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

# The tests that compare numbers again with oneDNN capped below this CPU (ONEDNN_MAX_CPU_ISA): other
# convolution kernels, summed and rounded otherwise, as an AVX2 or an older CPU runs them, so that a
# bound that holds on one CPU alone fails here and not on a user's machine (docs/equivalence.md). AVX2:
# the equivalence harness, the precision tests and the models', methods' and exports' numeric tests;
# SSE4.1: the equivalence harness and the precision tests. .ci/run runs it after make test.
ISA_NUMERIC := tests/integration/test_equivalence.py tests/integration/test_equivalence_unimatch.py \
	tests/integration/test_equivalence_fsdp.py \
	tests/inference/test_eval_precision.py tests/engine/test_amp_auto.py
test-isa: $(STAMP)
	ONEDNN_MAX_CPU_ISA=AVX2 $(PYTEST) $(ISA_NUMERIC) tests/methods tests/models tests/export
	ONEDNN_MAX_CPU_ISA=SSE41 $(PYTEST) $(ISA_NUMERIC)

# The floors (docs/dependencies.md): a venv on the oldest Python declared with every dependency at
# the release constraints/oldest.txt pins, then the fast subset there (installing downloads about
# 3 GB, most of it torch's CUDA build; the tests take 6 to 11 minutes on 2 cores). .ci/run runs it
# after make test.
OLDEST_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.10.*/bin/python3.10) python3.10)
OLDEST_VENV ?= .venv-oldest
OLDEST_STAMP := $(OLDEST_VENV)/.segadv-installed

$(OLDEST_STAMP): pyproject.toml constraints/oldest.txt
	test -x $(OLDEST_VENV)/bin/python || $(OLDEST_PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints/oldest.txt \
		-e ".[dev,export,plot,experiment]"
	$(OLDEST_VENV)/bin/python -m pip check
	touch $(OLDEST_STAMP)

test-oldest: $(OLDEST_STAMP)
	SEGADV_FLOORS=1 OMP_NUM_THREADS=1 $(OLDEST_VENV)/bin/python -m pytest -q -n 2 --dist loadfile -m "not slow"

bench: $(STAMP)
	$(PY) tools/bench.py

clean:
	rm -rf runs .pytest_cache
