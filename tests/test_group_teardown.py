"""A rank that joined its process group ends the group's gloo threads before the interpreter shuts down.

Left to interpreter shutdown, a gloo thread that releases a finished collective's tensors takes the GIL
and aborts the process (`parallel.dims.destroy_parallel`): SIGABRT after a run that went well, now and
then, on a loaded machine. Racy, so not reproduced here; what prevents it is checked instead: under
torchrun, each rank lists its threads just before the group is destroyed and again once `train` has
returned, or has raised and the error is still held. One torchrun run serves both: each rank trains
twice, first a run that raises, then one that returns (each joins and destroys a group of its own).
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
    with open(os.path.join(sys.argv[1], f"{ending}.{when}.{os.environ['RANK']}"), "w") as listing:
        listing.write("\n".join(names))

destroy = trainer.destroy_parallel
trainer.destroy_parallel = lambda: (threads("before"), destroy())
for ending, config in (("raised", sys.argv[3]), ("returned", sys.argv[2])):
    try:  # data.source=folder on a folder that is not there: the run raises
        trainer.train(load_config(config, ("data.source=folder",) if ending == "raised" else ()))
    except FacetrainError as error:
        print(f"{ending}: raised", error, flush=True)
        threads("after")  # its traceback still held, as when an error ends the process
    else:
        print(f"{ending}: returned", flush=True)
        threads("after")
"""


@pytest.fixture(scope="module")
def rank_threads(tmp_path_factory) -> tuple[dict[tuple[str, str], list[list[str]]], str]:
    """The thread names of each rank of a 2-rank torchrun run of the probe, by (ending, before or
    after), and the run's output."""
    tmp = tmp_path_factory.mktemp("teardown")
    probe, listings = tmp / "probe.py", tmp / "threads"
    probe.write_text(PROBE)
    listings.mkdir()
    returns = tiny_config(tmp, "run", train={"steps": 2}, checkpoint={"every": 2})
    raises = tiny_config(tmp, "raising", data={"path": str(tmp / "no_faces")})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    result = subprocess.run(
        [*command, str(probe), str(listings), str(returns), str(raises)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    moments = {
        (ending, when): [(listings / f"{ending}.{when}.{rank}").read_text().splitlines() for rank in range(2)]
        for ending in ("raised", "returned")
        for when in ("before", "after")
    }
    return moments, output


@pytest.mark.ranks
@pytest.mark.parametrize("ending", ["returned", "raised"])
def test_the_gloo_threads_end_with_the_run(rank_threads, ending):
    moments, output = rank_threads
    assert "returned: raised" not in output and "raised: returned" not in output, output
    assert f"{ending}: {ending}" in output, output
    for names in moments[ending, "before"]:
        assert any("gloo" in name for name in names), output
    for names in moments[ending, "after"]:
        assert not any("gloo" in name for name in names), output
