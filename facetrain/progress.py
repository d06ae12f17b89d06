"""Progress bars that suit where the output goes: tqdm's bar on a terminal, plain lines in a log.

A bar redraws itself in place with carriage returns; a log file or a pipe keeps every redraw, so a
training log becomes one line of thousands of bars. Written anywhere but a terminal, the same bar
prints its state as one plain line every `LINE_EVERY_S` seconds, and once more when it ends.
With `QUIET_ENV` set (what every command's `-q/--quiet` does) there is no bar at all.

During a training run the bars' plain lines also go to the run's `train.log` (`facetrain.run_log`), at
the same pace wherever the output goes. The lines of facetrain's logger (`facetrain.logger`) are
written around the bars: the bars are cleared, the line written, the bars drawn again.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from tqdm import tqdm

from facetrain.logger import LOG_ONLY, logger, set_console_writer

LINE_EVERY_S = 30.0
# the bar's words without its drawing: "train:  33% 100/300 [00:40<01:20, 2.50step/s, loss=1.2]"
PLAIN_FORMAT = "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
# set by `-q/--quiet` in the environment, so the ranks a command starts (and their data workers) inherit it
QUIET_ENV = "FACETRAIN_QUIET"


def is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class ProgressBar(tqdm):
    """tqdm on a terminal; elsewhere one line every LINE_EVERY_S seconds and a last one at the end."""

    def __init__(self, *args, **kwargs):
        if os.environ.get(QUIET_ENV, "") not in ("", "0"):
            kwargs["disable"] = True
        self.plain_lines = not is_terminal(kwargs.get("file") or sys.stderr)
        self._last_line_at = time.monotonic()  # no line at the start: the first comes after the interval
        self._last_logged_at = self._last_line_at  # of the run's log, when the bar is drawn on a terminal
        self._closing = False
        if self.plain_lines:
            kwargs.setdefault("mininterval", LINE_EVERY_S)
            kwargs.setdefault("bar_format", PLAIN_FORMAT)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if not self.plain_lines:
            now = time.monotonic()  # the run's log gets the plain line a pipe would get
            if msg != "" and (self._closing or now - self._last_logged_at >= LINE_EVERY_S):
                self._last_logged_at = now
                logger.info(
                    self.format_meter(**{**self.format_dict, "bar_format": PLAIN_FORMAT}), extra=LOG_ONLY
                )
            return super().display(msg, pos)
        if msg == "":  # clearing a bar: a plain line is never taken back
            return True
        now = time.monotonic()
        if not self._closing and now - self._last_line_at < LINE_EVERY_S:
            return True  # a redraw after another message (tqdm.write) repeats no line
        self._last_line_at = now
        line = self.__str__() if msg is None else msg
        logger.info(line, extra=LOG_ONLY)
        # tqdm's close() ends the last line itself
        self.fp.write(line)
        if not self._closing:
            self.fp.write("\n")
        self.fp.flush()
        return True

    def clear(self, nolock=False):
        if not self.plain_lines:
            super().clear(nolock)

    def close(self):
        self._closing = True
        super().close()


# tqdm's default lock pairs a thread lock with a multiprocessing one, which inside a spawned rank is a
# named semaphore: a rank killed with SIGKILL leaves it behind and its launcher's resource tracker warns of
# "leaked semaphore objects". facetrain's bars are each drawn by one process, so a thread lock suffices.
ProgressBar.set_lock(threading.RLock())
# facetrain's logger writes its lines as tqdm.write does: the bars cleared, the line, the bars redrawn
set_console_writer(lambda line, stream: ProgressBar.write(line, file=stream))
