"""examples/ train exactly as one process does, and each script runs as its docstring says.

Each distributed example's `train` runs on 2 gloo ranks (tests/distributed.run_distributed) in fp64 for
STEPS steps: through the smaller last batch of the first epoch (200 faces, 32 a batch) into the second.
Against one process on the same global batches (examples/single_process.py for the DDP and FSDP2
examples, the example itself without a process group for the others), every step's loss, the last
step's backbone gradients and the backbone and head weights after the last step agree to 1e-10 of
their magnitude: the same arithmetic, summed in another order. fp64 because fp32 rounds those sums
differently on 2 ranks (about 1e-6 relative after a few steps, tests/test_head_ddp.py).

Then each script runs as a user runs it (python, or torchrun with 2 CPU ranks), a few fp32 steps, and
the losses the DDP and FSDP2 scripts print are those the single-process script prints to 1e-5 (fp32;
the script runs as `__main__` in the test's process, the one script that needs no launcher).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.distributed import run_distributed

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
sys.path.insert(0, str(EXAMPLES))  # the examples import their stand-in data and backbone from there
STEPS = 8
HAS_TIMM = importlib.util.find_spec("timm") is not None


def full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2's parameters and gradients) as the whole tensor; a plain tensor as it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def trained(example: str) -> dict:
    losses, backbone, head = importlib.import_module(example).train(STEPS, "cpu", torch.float64)
    return {
        "losses": losses,
        "gradients": [full(param.grad).clone() for param in backbone.parameters()],
        "backbone": [full(param.detach()).clone() for param in backbone.parameters()],
        "head": (head.class_start, head.weight.detach().clone()),
    }


def rank_worker(rank: int, world_size: int, examples: list[str]) -> dict:
    return {example: trained(example) for example in examples}


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    scale = max(1.0, float(expected.abs().max()))
    assert float((actual - expected).abs().max()) <= 1e-10 * scale


DISTRIBUTED = ["ddp", "fsdp2", "tiled_fused", *(["timm_backbone"] if HAS_TIMM else [])]


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list[dict]]:
    """Every distributed example trained on the same 2 ranks (one pair of processes for them all)."""
    per_rank = run_distributed(rank_worker, 2, DISTRIBUTED, timeout=180)
    return {example: [results[example] for results in per_rank] for example in DISTRIBUTED}


def assert_trains_as(per_rank: list[dict], expected: dict) -> None:
    weight = torch.cat([shard for _, shard in sorted(result["head"] for result in per_rank)])
    assert_close(weight, expected["head"][1])
    for result in per_rank:
        assert result["losses"] == pytest.approx(expected["losses"], rel=1e-10)
        for name in ("gradients", "backbone"):
            assert len(result[name]) == len(expected[name])
            for actual, wanted in zip(result[name], expected[name]):
                assert_close(actual, wanted)


@pytest.mark.parametrize("example", ["ddp", "fsdp2"])
def test_the_ddp_and_fsdp2_examples_train_as_the_single_process_one(example, two_ranks):
    assert_trains_as(two_ranks[example], trained("single_process"))


@pytest.mark.parametrize(
    "example",
    [
        "tiled_fused",
        pytest.param("timm_backbone", marks=pytest.mark.skipif(not HAS_TIMM, reason="timm is not installed")),
    ],
)
def test_the_tiled_and_timm_examples_train_on_two_ranks_as_in_one_process(example, two_ranks):
    assert not torch.distributed.is_initialized()
    expected = trained(example)  # no process group here: one process, no DDP
    assert expected["head"][1].shape[0] == 100  # every class
    assert_trains_as(two_ranks[example], expected)


def run_script(script: str, ranks: int, steps: int = 3) -> str:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"] if ranks else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, *launcher, str(EXAMPLES / script), "--steps", str(steps), "--device", "cpu"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def printed_losses(stdout: str) -> list[float]:
    return [float(loss) for loss in re.findall(r"^step \d+: loss ([\d.]+), accuracy", stdout, re.MULTILINE)]


@pytest.fixture(scope="module")
def single_process_losses(monkeypatch_module) -> list[float]:
    """What `python examples/single_process.py --steps 3 --device cpu` prints, run as `__main__` in this
    process: the reference needs the script's output, not a process of its own (an interpreter and
    torch started again: 5 s of a core)."""
    monkeypatch_module.setattr(sys, "argv", ["single_process.py", "--steps", "3", "--device", "cpu"])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        runpy.run_path(str(EXAMPLES / "single_process.py"), run_name="__main__")
    losses = printed_losses(printed.getvalue())
    assert len(losses) == 3
    return losses


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("script", ["ddp.py", "fsdp2.py"])
def test_the_distributed_scripts_print_the_single_process_losses_under_torchrun(
    script, single_process_losses
):
    assert printed_losses(run_script(script, ranks=2)) == pytest.approx(single_process_losses, rel=1e-5)


def test_the_tiled_script_runs_under_torchrun():
    assert len(printed_losses(run_script("tiled_fused.py", ranks=2))) == 3


def test_the_timm_script_runs_or_says_in_one_line_that_timm_is_missing():
    stdout = run_script("timm_backbone.py", ranks=2 if HAS_TIMM else 0)
    if HAS_TIMM:
        assert len(printed_losses(stdout)) == 3
    else:
        assert stdout.splitlines() == [
            "timm is not installed, so this example has nothing to run: pip install timm"
        ]
