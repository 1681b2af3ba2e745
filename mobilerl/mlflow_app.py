"""`make ui`: MLflow's own server and UI, opening every experiment on its training runs in a new browser.

MLflow 3.17.2's UI opens an experiment on its GenAI overview ("Traces 0 — No data available") unless the browser
has chosen Model training with the switch at the top left (kept in its localStorage, ``mlflow.workflowType_v1``)
or the link carries ``?workflowType=machine_learning``; the experiment's ``mlflow.experimentKind`` tag, which says
so too, is not read (the code that would is behind a feature flag fixed on). MLflow 3.18, which reads it, needs an
``mlflow-tracing`` 3.18 that the package index here does not have. This app is MLflow's, run by ``mlflow server
--app-name mobilerl`` (MLflow's ``mlflow.app`` plugin entry point, as its basic-auth app is) with one change: its
page makes two choices for a browser that has made none, Model training, and the UI's usage telemetry off (the
project's default everywhere; the server drops the events anyway, MLFLOW_DISABLE_TELEMETRY, but the UI would ask).
The switch and the settings page still work, and a choice made there is kept.
"""

from __future__ import annotations

from typing import Any

WORKFLOW_KEY = "mlflow.workflowType_v1"
DEFAULTS = {WORKFLOW_KEY: '"machine_learning"',  # the UI's localStorage keys (name_v<version>) and JSON values
            "mlflow.settings.telemetry.enabled_v1": "false", "mlflow.telemetry.info.alert.dismissed_v1": "true"}
DEFAULT_SCRIPT = ("<script>try{" + "".join(f"localStorage.getItem('{k}')===null&&localStorage.setItem('{k}','{v}');"
                                           for k, v in DEFAULTS.items()) + "}catch(e){}</script>").encode()


def _training_by_default(response: Any) -> Any:
    if response.mimetype == "text/html" and response.status_code == 200:
        response.direct_passthrough = False  # send_from_directory streams the file
        page = response.get_data()
        if b"<head>" in page and WORKFLOW_KEY.encode() not in page:
            response.set_data(page.replace(b"<head>", b"<head>" + DEFAULT_SCRIPT, 1))
    return response


def create_app() -> Any:
    """MLflow's app with the default above: FastAPI under uvicorn (``mlflow server``'s default), Flask otherwise."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME
    from mlflow.server import app

    if _training_by_default not in app.after_request_funcs.get(None, []):
        app.after_request(_training_by_default)
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
