"""Serve the deployments of flow ``mobilerl``: ``full`` (the whole pipeline), ``smoke`` and ``ablation``.

Started by ``make serve`` after the local Prefect server is up; then, in another shell,
``prefect deployment run mobilerl/full`` (or ``mobilerl/smoke``, ``mobilerl/ablation``) runs it here. The ablation
study is its own flow function (``pipelines/ablation.py``) under the same flow name: a deployment keeps its own
entrypoint, so ``mobilerl/ablation`` runs that function and ``mobilerl/full`` the pipeline.
"""

from __future__ import annotations

from prefect import serve

from pipelines.ablation import ablation
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
    study = ablation.to_deployment(
        name="ablation",
        description="AdaGRPO ablations and peer options, variants x seeds (configs/ablation.yaml), resumable; "
                    "MLflow parent run with a nested run per cell; then the report.",
        tags=["mobilerl", "ablation"],
    )
    serve(full, smoke, study)


if __name__ == "__main__":
    main()
