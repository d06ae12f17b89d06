"""A run's records that cannot be written (#57, state and resume): `train.log`, `metrics.csv` or the
TensorBoard folder made read-only. The tests run as root, whom permissions do not stop, so the refusal
is simulated where the file is opened (EACCES, as an unprivileged user meets it).

At the start an unwritable log or metrics.csv is refused in one line naming it and what to do, before
anything is trained (it was `choose a writable folder with free space`, for a folder that was writable
and had space). During the run a record that cannot be written is one warning naming it and the run
trains on and checkpoints: a metrics.csv made read-only stopped the run, losing the steps since its last
checkpoint, and a TensorBoard folder that could not be written printed the writer thread's traceback."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from facetrain import files
from facetrain.checkpoint import run_dir
from facetrain.checkpoint.run_dir import APPENDED_FILES, METRICS_COLUMNS, claim_run_dir
from facetrain.cli import main
from facetrain.errors import FacetrainError
from facetrain.run_lock import holds
from tests.support.train_helpers import tiny_config

ADVICE = "check the permissions of the file and its folder"


def denied(path) -> PermissionError:
    return PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)


@pytest.mark.parametrize("name", APPENDED_FILES)
def test_a_record_that_cannot_be_appended_to_is_refused_at_the_start_naming_it(tmp_path, monkeypatch, name):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").write_text(",".join(METRICS_COLUMNS) + "\n")
    (run / "train.log").write_text("")
    appending = run_dir.open_appending

    def read_only(path: Path):
        if path.name == name:
            raise denied(str(path))
        return appending(path)

    monkeypatch.setattr(run_dir, "open_appending", read_only)
    with pytest.raises(FacetrainError) as refused:
        claim_run_dir(run)
    assert str(refused.value) == (
        f"cannot append to {run / name}: Permission denied; the run adds its record there from now on: "
        f"{ADVICE}, then run it again"
    )
    assert not holds(run)  # given up: the next start finds the run free


# the writer thread's traceback, which pytest takes over from Python and reports as this warning
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_records_unwritable_during_the_run_are_a_warning_each_and_it_trains_on_and_checkpoints(
    finished_run, tmp_path, monkeypatch
):
    data = {"path": str(finished_run / "synth")}  # the session's set: no set generated here
    train = {"steps": 2, "log_every": 1}
    config = tiny_config(tmp_path, data=data, train=train, checkpoint={"every": 1})
    # train.log and metrics.csv, which the run appends to through files.append_to_record (the run folder's
    # claim has opened them already, through its own name for open_appending)
    monkeypatch.setattr(files, "open_appending", lambda path: (_ for _ in ()).throw(denied(str(path))))
    opening = io.open

    def tensorboard_read_only(file, *args, **kwargs):
        if not isinstance(file, int) and b"tfevents" in os.fsencode(file):
            raise denied(file)
        return opening(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", tensorboard_read_only)
    result = CliRunner().invoke(main, ["train", "-c", str(config)])
    assert result.exit_code == 0, result.output[-3000:]
    assert "Traceback" not in result.output and "Exception in thread" not in result.output, result.output
    run = tmp_path / "run"
    assert (run / "checkpoints" / "last").read_text().strip() == "step_00000002"
    warnings = [line for line in result.output.splitlines() if line.startswith("warning: cannot write")]
    assert len(warnings) == 3, result.output[-3000:]
    log, rows, tensorboard = sorted(warnings, key=lambda line: ("train.log" not in line, "tfevents" in line))
    assert log == (
        f"warning: cannot write {run / 'train.log'}: Permission denied; training goes on, its lines on the "
        f"console only until you {ADVICE}"
    )
    assert rows == (
        f"warning: cannot write {run / 'metrics.csv'}: Permission denied; training goes on, its rows "
        f"unrecorded until you {ADVICE}"
    )
    assert tensorboard.startswith(f"warning: cannot write {run / 'tensorboard' / 'events.out.tfevents.'}")
    assert tensorboard.endswith(
        f": Permission denied; training goes on without tensorboard (metrics.csv keeps every figure): {ADVICE}, "
        "then resume to use it again"
    )
