# Two commands do all set-up: `make run` (install + main job on the embedded default), `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
export HF_HUB_OFFLINE := 1
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export MPLCONFIGDIR := $(CURDIR)/.cache/matplotlib

.PHONY: setup test run lint bench clean

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e ".[test]"
	touch $@

setup: $(BIN)/.installed

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check mobilerl tests scripts

run: setup
	$(BIN)/mobilerl env check-oracle --suite world --split test
	$(BIN)/mobilerl env check-oracle --suite lab --split test

bench: setup
	$(BIN)/python scripts/bench_env.py

clean:
	rm -rf $(VENV) .cache .pytest_cache
