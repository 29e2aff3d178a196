# `make demo` and `make test` create the environment themselves on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`; tests are handed out one by one, but those marked with
# one xdist_group (a module's Ray cluster) stay on one worker; TEST_WORKERS=0 runs the suite in
# this process
TEST_WORKERS ?= 2

.PHONY: venv demo test test-unit check format bench screenshots clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned, so pip never pulls a multi-GB CUDA build to satisfy torch>=2.4
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(VENV)/bin/trainhouse demo --example examples/digits

# The suite starts thousands of Python processes (servers, CLIs, supervisors, ranks): with
# PYTHONDONTWRITEBYTECODE set (some shells and images set it) each one compiled every
# trainhouse module it imported anew (a server 0.4-0.5 s of CPU more, a CLI call 0.2 s), so the
# suite's processes write and reuse bytecode caches whatever the shell says.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest

test: venv
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-unit: venv
	$(PYTEST) -n $(TEST_WORKERS) --dist loadgroup tests/unit $(PYTEST_ARGS)

check: venv
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/ruff format --check src tests bench examples
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: venv
	$(VENV)/bin/ruff check --fix src tests bench examples
	$(VENV)/bin/ruff format src tests bench examples

bench: venv
	$(PY) bench/overhead.py

# the README's pictures of the dashboard (docs/img/), taken again of a real server
screenshots: venv
	$(PY) -m tests.support.screenshots docs/img

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
