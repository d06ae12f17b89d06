"""`--nproc` forks its ranks from the launcher where no GPU is visible (`parallel.launch.launch_local`):
they start from the launcher's imports instead of importing torch again, and take the threads they are
given. That they train, checkpoint, stop and fail as spawned ranks did is what tests/test_train.py,
test_stop_signals.py and the fault tests check through `facetrain train --nproc`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from facetrain.parallel.dims import visible_gpus
from facetrain.parallel.launch import local_threads, rank_threads
from tests.support.train_helpers import REPO

# set by the launching script at run time: a forked rank sees its value, a spawned one imports the module
# afresh and sees None
LAUNCHER_PID: int | None = None

LAUNCH = """
import sys, torch
import tests.test_launch_fork as here
from facetrain.parallel.launch import launch_local
torch.set_num_threads(1)  # what `facetrain train --nproc` does first, so that it may fork
here.LAUNCHER_PID = __import__("os").getpid()
code = launch_local(2, here.describe_rank, sys.argv[1], fork=sys.argv[2] == "fork")
# torch's launcher set it for its agent; left behind, a pool started here later would not take SIGTERM
assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in __import__("os").environ
sys.exit(code)
"""


def describe_rank(folder: str) -> None:
    rank = os.environ["RANK"]
    described = {"forked": LAUNCHER_PID == os.getppid(), "threads": rank_threads()}
    Path(folder, f"{rank}.json").write_text(json.dumps(described))


@pytest.mark.ranks
@pytest.mark.parametrize("how", ["fork", "spawn"])
@pytest.mark.parametrize("omp_threads", [None, "3"])
def test_ranks_are_forked_where_no_gpu_is_visible_and_take_the_threads_they_are_given(
    tmp_path, how, omp_threads
):
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    if omp_threads:
        env["OMP_NUM_THREADS"] = omp_threads
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(
        [sys.executable, "-c", LAUNCH, str(tmp_path), how],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    forked = how == "fork" and not visible_gpus()
    threads = int(omp_threads) if omp_threads else local_threads(2)
    assert ranks == [{"forked": forked, "threads": threads}] * 2


def test_a_ranks_threads_come_from_omp_num_threads_or_its_share_of_the_cores(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert rank_threads() == max(1, (os.cpu_count() or 1) // 2)
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert rank_threads() == 5
