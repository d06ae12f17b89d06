"""A rank that joined its process group ends the group's gloo threads before the interpreter shuts down.

Left to interpreter shutdown, a gloo thread that releases a finished collective's tensors takes the GIL
and aborts the process (`parallel.dims.destroy_parallel`): SIGABRT after a run that went well, now and
then, on a loaded machine. Racy, so not reproduced here; what prevents it is checked instead: under
torchrun, each rank lists its threads just before the group is destroyed and again once `train` has
returned, or has raised and the error is still held.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.fault_helpers import ENV
from tests.support.train_helpers import REPO, tiny_config

PROBE = r"""
import os, sys
from facetrain.errors import FacetrainError
from facetrain.train import trainer
from facetrain.train.run_config import load_config

def threads(when):
    names = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
    with open(os.path.join(sys.argv[1], f"{when}.{os.environ['RANK']}"), "w") as listing:
        listing.write("\n".join(names))

destroy = trainer.destroy_parallel
trainer.destroy_parallel = lambda: (threads("before"), destroy())
try:
    trainer.train(load_config(sys.argv[2], tuple(sys.argv[3:])))
except FacetrainError as error:
    print("raised", error, flush=True)
    threads("after")  # its traceback still held, as when an error ends the process
else:
    threads("after")
"""


def rank_threads(tmp_path, *overrides: str) -> tuple[dict[str, list[list[str]]], str]:
    """The thread names of each rank of a 2-rank torchrun run of the probe, before and after, and the
    run's output."""
    probe, listings = tmp_path / "probe.py", tmp_path / "threads"
    probe.write_text(PROBE)
    listings.mkdir()
    config = tiny_config(tmp_path, "run", train={"steps": 2}, checkpoint={"every": 2})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    result = subprocess.run(
        [*command, str(probe), str(listings), str(config), *overrides],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    moments = {
        when: [(listings / f"{when}.{rank}").read_text().splitlines() for rank in range(2)]
        for when in ("before", "after")
    }
    return moments, output


@pytest.mark.ranks
@pytest.mark.parametrize("ending", ["returned", "raised"])
def test_the_gloo_threads_end_with_the_run(tmp_path, ending):
    overrides = ("data.source=folder",) if ending == "raised" else ()
    moments, output = rank_threads(tmp_path, *overrides)
    assert ("raised" in output) == (ending == "raised"), output
    for names in moments["before"]:
        assert any("gloo" in name for name in names), output
    for names in moments["after"]:
        assert not any("gloo" in name for name in names), output
