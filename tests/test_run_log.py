"""`RUN/train.log`: rank 0's lines and every rank's problems, under a header for each start of the run
(a handler of facetrain's logger)."""

from __future__ import annotations

import warnings

import pytest

from facetrain import run_log
from facetrain.errors import EveryRankError, FacetrainError, PeerFailed
from facetrain.logger import LOG_ONLY, logger
from facetrain.progress import ProgressBar
from facetrain.train.trainer import _logged


@pytest.fixture(autouse=True)
def detached():
    run_log.detach()
    yield
    run_log.detach()


@pytest.fixture
def attached(tmp_path, monkeypatch):
    """Rank 0's log of a run in tmp_path, its header written."""
    monkeypatch.setenv("RANK", "0")
    run_log.attach(tmp_path, "=== header")
    return tmp_path


def logged_lines(run_dir) -> list[str]:
    """The log's lines without their timestamps."""
    return [line.split(" ", 2)[2] for line in (run_dir / run_log.LOG_NAME).read_text().splitlines()]


def test_lines_before_the_run_dir_is_known_follow_the_header(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    logger.info("device defaults (cpu): pin_memory off")
    logger.warning("warning: the schedule ends before warmup")
    logger.warning("warning: UserWarning: from before the run", extra=LOG_ONLY)  # a Python warning
    logger.error("error: the previous run's")
    run_log.attach(tmp_path, "=== header")
    logger.info("resumed from step 3")
    assert logged_lines(tmp_path) == [
        "=== header",
        "device defaults (cpu): pin_memory off",
        "warning: the schedule ends before warmup",
        "resumed from step 3",
    ]


def test_other_ranks_log_only_their_problems_named_by_rank(attached, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    logger.info("a line every rank prints alike")
    logger.error("error: image 7 is unreadable")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("gloo is slow", UserWarning, stacklevel=1)
    assert logged_lines(attached) == [
        "=== header",
        "[rank 1] error: image 7 is unreadable",
        "[rank 1] warning: UserWarning: gloo is slow",
    ]


def test_a_python_warning_is_one_line_once_in_the_log_and_on_the_console(attached, capsys):
    """torch's warnings run over several lines and may come at every step (issue 58): the run says
    each once, in one line, and nothing else of it reaches the console."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn("Grad strides do not match.\ngrad.sizes() = [8, 4]", UserWarning, stacklevel=1)
    line = "warning: UserWarning: Grad strides do not match. grad.sizes() = [8, 4]"
    assert logged_lines(attached) == ["=== header", line]
    console = capsys.readouterr()
    assert (console.out + console.err).splitlines() == [line]


def test_a_bar_on_a_terminal_leaves_its_plain_last_line_in_the_log(attached):
    with ProgressBar(total=4, desc="train", unit="step") as bar:
        bar.plain_lines = False  # drawn as on a terminal
        bar.update(4)
    last = logged_lines(attached)[-1]
    assert last.startswith("train: 100% 4/4 [") and "|" not in last


def test_the_header_names_the_slurm_job_its_restart_and_the_world_size(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    header = run_log.start_header("resumed from runs/x/checkpoints/step_00000040 at step 40", 8)
    assert header.startswith(
        "=== facetrain train: resumed from runs/x/checkpoints/step_00000040 at step 40, "
    )
    assert "world size 8" in header and "Slurm job 4242 (restart 2)" in header


def test_errors_are_logged_once_by_the_rank_they_belong_to(attached, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    _logged(EveryRankError("train.batch_size is too large"))  # rank 0 logs it
    _logged(PeerFailed("another rank could not read its data"))  # a bystander
    _logged(FacetrainError("step 5: data/a.jpg is unreadable"))
    _logged(RuntimeError("CUDA error"))
    assert logged_lines(attached) == [
        "=== header",
        "[rank 1] error: step 5: data/a.jpg is unreadable",
        "[rank 1] error: RuntimeError: CUDA error (its traceback is on stderr)",
    ]


def test_a_log_that_cannot_be_written_never_stops_training(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    run_log.attach(tmp_path / "gone", "=== header")  # no such folder
    logger.info("still training")
    logger.error("error: still reported on stderr")
    assert not (tmp_path / "gone").exists()
