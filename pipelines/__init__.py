"""Prefect flows and deployments (flow ``mobilerl``; deployments ``full`` and ``smoke``)."""
