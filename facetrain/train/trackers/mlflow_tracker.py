"""MLflow: an MLflow run per start of the facetrain run, the config as its params, in the tracking
store and experiment MLflow's own settings name (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME).

`mlflow-skinny` is enough: only the tracking client is used. Its default store (a sqlite file) needs
what only the full mlflow brings, so with skinny a run says so in one line; a server's URI, or a file
store (with MLFLOW_ALLOW_FILE_STORE=true on MLflow 3), needs nothing more.
"""

from __future__ import annotations

from pathlib import Path

from facetrain.errors import FacetrainError
from facetrain.train.trackers.base import TRACKERS, missing


class MlflowTracker:
    module, package, extra = "mlflow", "mlflow-skinny", "mlflow"  # imported, installed, facetrain's extra

    def __init__(self, run_dir: Path):
        try:
            import mlflow
        except ImportError:
            raise missing("mlflow") from None
        self.mlflow = mlflow
        try:
            self.run = mlflow.start_run(run_name=run_dir.resolve().name)
        except mlflow.exceptions.MlflowException as error:  # mlflow-skinny's default store, say
            raise FacetrainError(
                f"train.trackers lists mlflow, which cannot start a run in {mlflow.get_tracking_uri()} "
                f"({type(error).__name__}): set MLFLOW_TRACKING_URI to your tracking server, or install "
                "mlflow for its own default store"
            ) from None

    def log_config(self, config: dict) -> None:
        self.mlflow.log_params(_flat(config))

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.mlflow.log_metrics(metrics, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


def _flat(config: dict, prefix: str = "") -> dict[str, str]:
    """MLflow's params are flat strings: `train.steps`, not a nested mapping."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


TRACKERS.register("mlflow")(MlflowTracker)
