"""Orchestration: the Prefect flow ``mobilerl`` and its deployments (DVC owns the DAG)."""

import os

# before Prefect is imported (settings are read then): a temporary local API of `python -m pipelines.*` sends
# no telemetry either (the Makefile sets the same for `make serve`)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "true")
