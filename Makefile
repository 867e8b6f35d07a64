VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: setup test demo lint bench train clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest tests

lint: $(STAMP)
	$(VENV)/bin/ruff check engine workbench tests bench

demo: $(STAMP)
	$(PY) -m workbench.demo

bench: $(STAMP)
	$(PY) -m bench

train: $(STAMP)
	$(PY) -m engine.train --steps 2400 --seed 0 --out data/model

clean:
	rm -rf $(VENV) reports runs
