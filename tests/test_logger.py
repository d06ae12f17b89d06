"""facetrain's one logger: rank 0's info lines, every rank's warnings and errors named by rank, each on
its stream, written around the progress bars."""

from __future__ import annotations

import io
import logging

import pytest

import facetrain.logger
from facetrain.logger import LOG_ONLY, logger, warnings_beside_info
from facetrain.progress import ProgressBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def rank(monkeypatch):
    def set_rank(value: str) -> None:
        monkeypatch.setenv("RANK", value)

    set_rank("0")
    return set_rank


def test_rank_0_shows_info_on_stdout_and_problems_on_stderr(rank, capsys):
    logger.info("resumed from step 3")
    logger.warning("warning: the schedule ends early")
    logger.error("error: rank 1 of 2 failed")
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["resumed from step 3"]
    assert captured.err.splitlines() == ["warning: the schedule ends early", "error: rank 1 of 2 failed"]


def test_other_ranks_show_only_their_problems_named_by_rank(rank, capsys):
    rank("3")
    logger.info("a line every rank prints alike")
    logger.warning("warning: image 7 is unreadable")
    logger.error("error: out of memory")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "[rank 3] warning: image 7 is unreadable",
        "[rank 3] error: out of memory",
    ]


def test_a_training_run_keeps_its_warnings_beside_its_info_lines(rank, capsys):
    with warnings_beside_info():
        logger.info("resumed from step 3")
        logger.warning("warning: the schedule ends early")
        logger.error("error: rank 1 of 2 failed")
    logger.warning("warning: after the run")
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["resumed from step 3", "warning: the schedule ends early"]
    assert captured.err.splitlines() == ["error: rank 1 of 2 failed", "warning: after the run"]


def test_a_log_only_line_stays_off_the_console(rank, capsys):
    logger.info("train:  50% 2/4 [00:01<00:01]", extra=LOG_ONLY)
    logger.error("error: told by the command itself", extra=LOG_ONLY)
    assert capsys.readouterr() == ("", "")


def test_a_line_written_under_a_bar_on_a_terminal_leaves_the_bar_whole(rank, monkeypatch):
    screen = Terminal()
    monkeypatch.setattr("sys.stdout", screen)
    with ProgressBar(total=4, desc="train", unit="step", file=screen, mininterval=0) as bar:
        bar.update(2)
        logger.info("resumed from step 2")
        drawn_before = screen.getvalue().rsplit("resumed from step 2", 1)[0]
        bar.update(2)
    output = screen.getvalue()
    assert "\rresumed from step 2\n" in output  # the bar was cleared first, the line is whole
    assert drawn_before.count("2/4") >= 1 and output.rsplit("resumed from step 2\n", 1)[1].count("2/4") >= 1
    assert "4/4" in output.rsplit("resumed from step 2\n", 1)[1]


def test_the_logger_is_configured_once_and_copies_no_line_to_the_root_logger(rank, capsys):
    facetrain.logger._configure()
    root = logging.getLogger()
    copies = io.StringIO()
    handler = logging.StreamHandler(copies)
    root.addHandler(handler)
    try:
        logger.info("one line")
    finally:
        root.removeHandler(handler)
    assert logger.handlers.count(facetrain.logger.console) == 1
    assert capsys.readouterr().out == "one line\n" and copies.getvalue() == ""


def test_another_ranks_line_on_a_terminal_starts_a_fresh_line(rank, monkeypatch):
    """Rank 0's progress bar on the same terminal may be mid-line: rank 1's error starts below it."""
    rank("1")
    screen, pipe = Terminal(), io.StringIO()
    monkeypatch.setattr("sys.stderr", screen)
    logger.error("error: out of memory")
    monkeypatch.setattr("sys.stderr", pipe)
    logger.error("error: out of memory")
    assert screen.getvalue() == "\n[rank 1] error: out of memory\n"
    assert pipe.getvalue() == "[rank 1] error: out of memory\n"
