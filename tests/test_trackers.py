"""`train.trackers`: each tracker takes the run's config and figures; a missing package is one line.

W&B and MLflow are not in the test extra (docs/training.md says why): their tests run where they are
installed, W&B offline and MLflow on a file store, both in tmp_path.
"""

from __future__ import annotations

import sys
import time
from importlib.util import find_spec

import pytest

from facetrain import run_log
from facetrain.errors import FacetrainError
from facetrain.train import trackers
from facetrain.train.run_checks import validate
from facetrain.train.run_config import load_config
from facetrain.train.trackers import TRACKERS, TrackerMissing, open_trackers

CONFIG = {"train": {"steps": 6}, "model": {"backbone": "small"}}


def log_a_little(name: str, run_dir) -> None:
    tracker = TRACKERS.build(name, run_dir)
    tracker.log_config(CONFIG)
    tracker.log_metrics(1, {"train/loss": 2.0})
    tracker.log_metrics(2, {"train/loss": 1.5, "eval/accuracy": 0.625})
    tracker.close()


def test_tensorboard_off_is_said_once_with_why(tmp_path, monkeypatch, capsys):
    run_log.detach()
    assert open_trackers([], tmp_path) == []
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed
    assert open_trackers(["tensorboard"], tmp_path) == []
    assert capsys.readouterr().out.splitlines() == [
        "note: TensorBoard logging is off: train.trackers is [] (add tensorboard)",
        "note: TensorBoard logging is off: train.trackers lists tensorboard, which needs tensorboard: "
        "pip install 'facetrain[app]' (or pip install tensorboard)",
    ]


@pytest.mark.parametrize(("name", "module", "command"), [("wandb", "wandb", "pip install 'facetrain[wandb]'"),
                                                         ("mlflow", "mlflow", "pip install 'facetrain[mlflow]'")])  # fmt: skip
def test_a_chosen_tracker_that_is_missing_stops_the_run_in_one_line(
    tmp_path, monkeypatch, name, module, command
):
    """Before the run starts (`check_installed`, on every rank), and if it went missing since, when opened."""
    monkeypatch.setattr(trackers, "find_spec", lambda wanted: None if wanted == module else object())
    monkeypatch.setitem(sys.modules, module, None)
    for attempt in (trackers.check_installed, lambda names: open_trackers(names, tmp_path)):
        with pytest.raises(TrackerMissing) as raised:
            attempt(["tensorboard", name])
        message = str(raised.value)
        assert message.startswith(f"train.trackers lists {name}, ") and command in message
        assert "\n" not in message
    trackers.check_installed(["tensorboard"])  # TensorBoard's absence is a note when opened, not an error


def test_an_unknown_or_repeated_tracker_is_a_config_error():
    for names, problem in ((["neptune"], "'neptune' must be one of: mlflow, tensorboard, wandb"),
                          (["wandb", "wandb"], "must not name one twice")):  # fmt: skip
        with pytest.raises(FacetrainError, match=problem):
            validate(load_config(overrides=[f"train.trackers={names}"]))


def test_tensorboard_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    log_a_little("tensorboard", tmp_path)
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_wandb_offline_keeps_the_run_beside_the_checkpoints(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log_a_little("wandb", run_dir)
    (records,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    # W&B's service process writes the offline file: `finish()` may return a moment before the
    # records reach it (measured with wandb 0.31: up to 0.1 s, in 1 run of 3)
    deadline = time.monotonic() + 10
    while b"eval/accuracy" not in (data := records.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"train/loss" in data and b"eval/accuracy" in data and b"backbone" in data


def test_mlflow_logs_params_and_each_figure_at_its_step(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store on request
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log_a_little("mlflow", run_dir)
    client = mlflow.MlflowClient()
    (run,) = client.search_runs(["0"])
    assert run.info.run_name == "run" and run.data.params == {"train.steps": "6", "model.backbone": "small"}
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.5)]


def test_mlflow_skinny_without_a_store_it_can_use_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    if find_spec("sqlalchemy") is not None:
        pytest.skip("the full mlflow can use its default sqlite store")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(
        FacetrainError, match=r"^train.trackers lists mlflow, which cannot start a run in sqlite:"
    ):
        TRACKERS.build("mlflow", tmp_path)
