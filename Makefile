# Two commands do all set-up: `make run` (install + main job on the embedded default), `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Offline and local by default: no hub, no telemetry, caches inside the project.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export DO_NOT_TRACK := true
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export GRADIO_ANALYTICS_ENABLED := False
export TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS :=
export HF_HOME := $(CURDIR)/.cache/hf
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export MPLCONFIGDIR := $(CURDIR)/.cache/matplotlib

.PHONY: setup system-deps test run lint bench clean

# torch first (the local CPU build, pinned), then everything else in one resolver call under the
# same constraints; deepspeed builds no ops and needs torch at build time (no build isolation).
$(BIN)/.installed: pyproject.toml constraints.txt scripts/fix_cpu_torch.py
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -c constraints.txt torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q --no-build-isolation -c constraints.txt -e ".[all]"
	$(BIN)/python scripts/fix_cpu_torch.py
	touch $@

# tesseract (OCR for image privacy masking) comes from Debian; installed only when missing.
system-deps:
	@command -v tesseract >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tesseract-ocr >/dev/null; \
	  else echo "tesseract-ocr missing: run 'sudo apt-get install tesseract-ocr'"; fi; }

setup: $(BIN)/.installed system-deps

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
