"""Progress bars: tqdm's redrawn bar on a terminal, plain periodic lines in a log file or a pipe."""

from __future__ import annotations

import io

import facetrain.progress
from facetrain.progress import ProgressBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run_bar(stream, steps: int = 10) -> str:
    bar = ProgressBar(total=steps, desc="train", unit="step", file=stream)
    for step in range(steps):
        bar.update(1)
        bar.set_postfix(loss=f"{step:.3f}")
        if step == 4:
            ProgressBar.write("warning: a message between two lines", file=stream)
    bar.close()
    return stream.getvalue()


def test_a_log_gets_whole_lines_at_the_interval_and_the_last_state(monkeypatch):
    monkeypatch.setattr(facetrain.progress, "LINE_EVERY_S", 0.0)
    log = run_bar(io.StringIO())
    assert "\r" not in log and "\x1b" not in log
    lines = log.splitlines()
    assert "warning: a message between two lines" in lines
    assert lines[-1].startswith("train: 100% 10/10 [") and lines[-1].endswith(", loss=9.000]")
    assert lines[0] == "train:   0% 0/10 [00:00<?, ?step/s]"


def test_a_log_within_the_interval_gets_only_the_last_line():
    lines = run_bar(io.StringIO()).splitlines()
    assert lines == ["warning: a message between two lines", lines[-1]]
    assert lines[-1].startswith("train: 100% 10/10 [")


def test_a_terminal_gets_tqdms_bar():
    assert "\r" in run_bar(Terminal())
