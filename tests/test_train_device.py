"""What a run takes from its device (issue 56, items 4 and 5): train.precision auto and the warning of
an explicit bf16 on a CPU without bf16 units, in a real run; the start-up to the first step, logged
and in the summary; and a training step whose host side never reads a tensor back, so on a GPU the
host runs ahead of the device between log intervals.

How `auto` and the warning resolve on faked hardware: tests/test_device_defaults.py.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch
import yaml

from facetrain.heads import ShardedMarginHead
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.train.device_defaults import native_bf16
from facetrain.train.optim import OptimConfig, build_optimizer
from facetrain.train.step import StepParts, StepSettings, StepWindow, train_step
from tests.support.train_helpers import REPO, run_cli_at_once, tiny_config

BF16_WARNING = "warning: train.precision=bf16 on a CPU without bf16 units"


def test_a_run_keeps_its_resolved_precision_and_times_its_start_and_bf16_warns_once(tmp_path):
    auto = tiny_config(tmp_path, "auto", train={"steps": 2, "precision": "auto"})
    bf16 = tiny_config(tmp_path, "bf16", train={"steps": 1, "precision": "bf16"})
    ran_auto, ran_bf16 = run_cli_at_once(
        ("train", "-c", str(auto)), ("train", "-c", str(bf16), "--nproc", "2")
    )
    assert ran_auto.returncode == 0, ran_auto.stderr
    assert ran_bf16.returncode == 0, ran_bf16.stderr
    native = native_bf16("cpu")

    expected = "bf16" if native else "fp32"
    saved = yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())
    assert saved["train"]["precision"] == expected
    assert f"precision {expected} (" in ran_auto.stdout
    assert BF16_WARNING not in ran_auto.stdout + ran_auto.stderr

    startup = json.loads((tmp_path / "auto" / "summary.json").read_text())["startup_s"]
    assert set(startup) == {"setup_s", "first_batch_s", "first_step_s", "total_s"}
    assert all(seconds >= 0 for seconds in startup.values())
    assert startup["total_s"] == pytest.approx(sum(v for k, v in startup.items() if k != "total_s"))
    assert ran_auto.stdout.count("start-up: first step done") == 1

    # two ranks, one warning (from the primary rank), and only where bf16 is emulated
    output = ran_bf16.stdout + ran_bf16.stderr
    assert output.count(BF16_WARNING) == (0 if native else 1)
    assert yaml.safe_load((tmp_path / "bf16" / "config.yaml").read_text())["train"]["precision"] == "bf16"


HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


@pytest.fixture
def host_reads_refused(monkeypatch):
    """While on, any read of a tensor's value into Python fails the test: on a GPU each is a wait."""
    state = {"on": False}

    def refusing(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if state["on"]:
                raise AssertionError(f"Tensor.{name} read a value back during a step")
            return original(self, *args, **kwargs)

        return read

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, refusing(name))
    return state


@pytest.mark.parametrize("grad_clip", [None, 5.0])
def test_steps_between_log_intervals_read_nothing_back(host_reads_refused, grad_clip):
    """train_step and the window's sums and non-finite watch, as the loop runs them between two logs.
    The first step may read (the head checks every rank's inputs once); none after it does."""
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone="small", embedding_size=16), (32, 32))
    head = ShardedMarginHead(10, 16, margin="arcface")
    optimizer = build_optimizer(OptimConfig(lr=0.01, grad_clip=grad_clip), backbone, head, grad_scaling=False)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    settings = StepSettings(torch.device("cpu"), "fp32", accumulation=2, grad_clip=grad_clip)
    parts = StepParts(backbone, head, optimizer, scaler, settings)
    batch = (torch.randn(4, 3, 32, 32), torch.tensor([0, 3, 3, 9]))
    batches = itertools.repeat(batch)
    window = StepWindow(settings.device)
    window.add(train_step(batches, parts), 1)
    host_reads_refused["on"] = True
    for step in range(2, 5):
        window.add(train_step(batches, parts), step)
    host_reads_refused["on"] = False
    window.check_finite(0, None)  # the log interval's one read
    assert window.steps == 4 and torch.isfinite(window.sums).all()


# `facetrain train` in a fresh interpreter with torch's CUDA sync debug mode on: each operation that
# makes the host wait for the GPU warns, and the warnings are counted
SYNC_COUNT = """
import sys, warnings
import torch
from facetrain.cli import main

torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        main(["train", "-c", sys.argv[1]], standalone_mode=False)
    finally:
        print("SYNCS", sum("synchroniz" in str(w.message) for w in caught))
"""


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_host_waits_for_the_gpu_no_more_often_for_more_steps_between_logs(tmp_path):
    """The waits of a run (the first step's input check and start-up clock, the one log and the final
    checkpoint) are as many for 8 steps as for 3: none comes with a step between two logs."""
    counts = []
    for steps in (3, 8):
        train = {"steps": steps, "log_every": 100, "deterministic": False}
        config = tiny_config(tmp_path, f"run{steps}", train=train, checkpoint={"every": 100})
        result = subprocess.run(
            [sys.executable, "-c", SYNC_COUNT, str(config)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stderr
        [line] = [line for line in result.stdout.splitlines() if line.startswith("SYNCS ")]
        counts.append(int(line.removeprefix("SYNCS ")))
    assert counts[0] == counts[1], counts
