# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

# Registry downloads break off now and then (CI once lost a 10.6 MB wheel six times at
# 10.0 MB): pip retries and resumes more than its defaults (an older pip ignores the
# variables it does not know), and each install is tried three times.
export PIP_RETRIES := 10
export PIP_RESUME_RETRIES := 20
export PIP_TIMEOUT := 60
PIP_INSTALL = sh -c 'for try in 1 2 3; do "$$0" -m pip install --quiet "$$@" && exit 0; \
    echo "pip install failed (try $$try of 3)" >&2; [ $$try = 3 ] || sleep 15; done; exit 1' $(BIN)/python

.PHONY: demo test install lint docs bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip || { rm -rf $(VENV); exit 1; }

# torch: keep whatever recent build is installed (users bring their own CUDA build);
# otherwise take torch==2.13.0, a local CPU build on our machines.
# torchvision (trainsim trace --model torchvision:NAME): the release that pairs with the
# installed torch, 0.(minor + 15) for torch 2.minor (0.28 for 2.13).
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(PIP_INSTALL) torch==2.13.0
	$(BIN)/python -m pip show -q torchvision >/dev/null 2>&1 || $(PIP_INSTALL) \
	    "torchvision~=0.$$($(BIN)/python -c 'import torch; print(int(torch.__version__.split(".")[1]) + 15)').0"
	$(PIP_INSTALL) -e ".[dev]"
	touch $(STAMP)

# Tests also hand exports to DeepSpeed, megatron-core and torchtitan (the export-check extra),
# trace BERT and RoBERTa with transformers (the trace extra) and run sweeps on a real local
# Ray cluster (the sweep-ray extra).
$(TEST_STAMP): $(STAMP)
	$(PIP_INSTALL) -e ".[dev,export-check,trace,sweep-ray]"
	touch $(TEST_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/trainsim demo

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# The documentation site (docs/, mkdocs.yml) into site/; --strict turns every warning into an error.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

test: lint docs
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python experiments/bench_analytic.py

clean:
	rm -rf $(VENV) build *.egg-info
