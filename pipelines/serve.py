"""Serve the deployments of flow ``mobilerl``: ``full`` (the whole pipeline) and ``smoke``.

Started by ``make serve`` after the local Prefect server is up; then, in another shell,
``prefect deployment run mobilerl/full`` (or ``mobilerl/smoke``) runs the pipeline here.
"""

from __future__ import annotations

from prefect import serve

from pipelines.flow import mobilerl


def main() -> None:
    full = mobilerl.to_deployment(
        name="full",
        description="The whole MobileRL pipeline on params.yaml as is (the embedded tiny default).",
        parameters={"preset": None},
        tags=["mobilerl"],
    )
    smoke = mobilerl.to_deployment(
        name="smoke",
        description="A minutes-long run of every stage with tiny budgets, in a temporary copy of the repo.",
        parameters={"preset": "smoke", "isolated": True},
        tags=["mobilerl", "smoke"],
    )
    serve(full, smoke)


if __name__ == "__main__":
    main()
