# Two entry points: `make demo` and `make test`. Both set up .venv (idempotent) first.
PY ?= python3
# make test's pytest workers (pytest-xdist), each taking whole test files: on the 2-core machine the suite
# waits on nsys, servers and notebooks more than it computes, so two workers nearly halve its wall time.
TEST_WORKERS ?= 2
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kit-installed

.PHONY: demo test test-gpu setup nsys browser lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first and explicitly: on a CPU machine this takes the CPU build; a bare `torch` pulls CUDA (GBs).
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

nsys:
	@bash scripts/ensure-nsys.sh || { rc=$$?; if [ "$$rc" = 3 ] && [ "$${CI:-}" != true ]; then echo "continuing without nsys"; else exit $$rc; fi; }

browser:
	@bash scripts/ensure-chromium.sh || { rc=$$?; if [ "$$rc" = 3 ] && [ "$${CI:-}" != true ]; then echo "continuing without chromium"; else exit $$rc; fi; }

demo: setup nsys
	$(BIN)/kit demo

test: setup nsys browser
	$(BIN)/ruff check kit tests scripts
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-gpu: setup
	$(BIN)/python -m pytest -q tests/gpu

lint: setup
	$(BIN)/ruff check kit tests scripts

clean:
	rm -rf $(VENV) runs build .pytest_cache
