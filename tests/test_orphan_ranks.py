"""A `--nproc` launcher killed with SIGKILL leaves no rank running (facetrain/parallel/launcher_watch.py).

Before, both ranks stopped at a step and then waited forever for the dead launcher (torch's rank wrapper
waits for it to read their result), deaf to SIGTERM, with parent PID 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facetrain.checkpoint import find_resume_point
from tests.support.fault_helpers import ENV, kill_all, rank_processes, start, wait_for_step
from tests.support.train_helpers import REPO, tiny_config


def alive(pid: int) -> bool:
    """Running, neither gone nor a zombie waiting for a dead parent's reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def seconds_until_gone(pids: list[int], limit: float) -> float:
    """How long after now the last of `pids` lived; kills them and fails past `limit`."""
    began = time.monotonic()
    while any(alive(pid) for pid in pids):
        if time.monotonic() - began > limit:
            for pid in filter(alive, pids):
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"processes {pids} still running {limit} s after their parent's death")
        time.sleep(0.05)
    return time.monotonic() - began


def session_gone(session: int, limit: float) -> bool:
    """Whether every process of the session `session` has exited (or is a zombie) within `limit` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if not [
            pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if in_session(pid, session)
        ]:
            return True
        time.sleep(0.1)
    return False


def in_session(pid: int, session: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return fields[0] != "Z" and int(fields[3]) == session  # state, ppid, pgrp, session


@pytest.mark.slow
def test_ranks_of_a_launcher_killed_with_sigkill_checkpoint_and_exit_within_seconds(tmp_path):
    timeout_s = 90  # also covers rank 0 generating the synthetic set while rank 1 waits for it, under load
    config = tiny_config(
        tmp_path,
        "run",
        train={"steps": 100000},
        checkpoint={"every": 100000},
        parallel={"timeout_s": timeout_s},
    )
    # its output goes to files (`start`): a pipe that nobody reads would stall the ranks
    launcher = start("train", "-c", str(config), "--nproc", "2")
    try:
        wait_for_step(launcher, tmp_path / "run", 2)
        ranks = rank_processes(launcher.pid)
        assert len(ranks) == 2
        launcher.kill()
        launcher.wait()
        lived = seconds_until_gone(ranks, limit=timeout_s)
        session_ended = session_gone(launcher.pid, limit=30)  # the resource tracker, the last one
        out, err = launcher.communicate()  # the ranks' output too: they wrote to the launcher's
    finally:
        kill_all(launcher)
    assert lived < 15, f"ranks lived {lived:.1f} s after the launcher"
    assert session_ended, "a process of the killed launcher's session outlived it by 30 s"
    # the launcher's resource tracker removed torch elastic's semaphores without a warning about them
    assert "leaked semaphore" not in err
    checkpoint, _ = find_resume_point(tmp_path / "run")  # they stopped at a step boundary, with a checkpoint
    assert checkpoint.name.startswith("step_") and int(checkpoint.name[5:]) >= 2
    assert "stopped at step" in out


# a child of PARENT, deaf to SIGTERM and SIGINT, that watches its parent and then does `body`
CHILD = """
import os, signal, sys, threading, time
from facetrain.parallel.launcher_watch import run_watched
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent, grace_s = int(sys.argv[1]), float(sys.argv[2])
print("watching", flush=True)
{body}
"""
BODIES = {
    # a rank stuck before any step boundary: only the grace period ends it
    "stuck": "run_watched(time.sleep, parent, grace_s, 3600)",
    # a rank whose work returned, then waits for the launcher to read its result, as torch's wrapper does
    "returned": "run_watched(int, parent, grace_s); threading.Event().wait()",
}
PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid()), sys.argv[2]])
print(child.pid, flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize(
    ("body", "grace_s", "bound_s"), [("stuck", 1.0, (0.8, 5.0)), ("returned", 60.0, (0, 3.0))]
)
def test_a_rank_outlives_its_dead_launcher_by_at_most_the_grace_period(body, grace_s, bound_s):
    child_code = CHILD.format(body=BODIES[body])
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, child_code, str(grace_s)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline() == "watching\n"  # the child's output, through the same pipe
        assert alive(child)
        parent.kill()
        parent.wait()
        lived = seconds_until_gone([child], limit=20)
    finally:
        parent.stdout.close()
        if alive(child):
            os.kill(child, signal.SIGKILL)
    assert bound_s[0] <= lived < bound_s[1]
