"""`facetrain bench --device`: what can be proven without a GPU.

Device choice, the CUDA timer and peak-memory window driven through an injected stand-in for
torch.cuda (so the CUDA code paths run here), the backend a worker pool picks, the one-line refusals,
and the GPU check's plan parsed against the real CLI.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys

import click
import pytest
import torch
from click.testing import CliRunner

from facetrain.bench.common import (
    CudaClock,
    CudaPeak,
    HostClock,
    clock_for,
    peak_memory,
    timed_repeats,
)
from facetrain.bench.pipeline_cases import PipelineBenchSettings, check_settings
from facetrain.cli import main
from facetrain.cli.bench_train import train_command
from facetrain.devices import resolve_device
from facetrain.errors import FacetrainError
from facetrain.parallel.dims import check_backend
from facetrain.process_memory import PeakRss
from tests.support.train_helpers import REPO

CUDA = torch.device("cuda", 0)


class FakeCuda:
    """Records what the CUDA helpers ask of torch.cuda; events are 0.25 s apart, memory is scripted."""

    calls: list = []
    allocated, peak = 100, 100

    @classmethod
    def reset(cls, allocated=100, peak=100):
        cls.calls, cls.allocated, cls.peak = [], allocated, peak

    class Event:
        count = 0

        def __init__(self, enable_timing: bool):
            assert enable_timing
            FakeCuda.Event.count += 1
            self.index = FakeCuda.Event.count

        def record(self):
            FakeCuda.calls.append(("record", self.index))

        def synchronize(self):
            FakeCuda.calls.append(("event_synchronize", self.index))

        def elapsed_time(self, end) -> float:
            return 250.0 * (end.index - self.index)

    @staticmethod
    def synchronize(device=None):
        FakeCuda.calls.append(("synchronize", device))

    @staticmethod
    def empty_cache():
        FakeCuda.calls.append(("empty_cache",))

    @staticmethod
    def reset_peak_memory_stats(device=None):
        FakeCuda.calls.append(("reset_peak", device))

    @staticmethod
    def memory_allocated(device=None):
        return FakeCuda.allocated

    @staticmethod
    def max_memory_allocated(device=None):
        return FakeCuda.peak


def test_auto_follows_torch_and_cuda_without_a_gpu_is_a_user_error():
    assert resolve_device("auto", cuda_available=lambda: True) == "cuda"
    assert resolve_device("auto", cuda_available=lambda: False) == "cpu"
    assert resolve_device("cpu", cuda_available=lambda: True) == "cpu"
    assert resolve_device("cuda", cuda_available=lambda: True) == "cuda"
    with pytest.raises(FacetrainError, match="--device cuda: torch sees no CUDA device"):
        resolve_device("cuda", cuda_available=lambda: False)


def test_the_timer_follows_the_device_type():
    assert isinstance(clock_for(None), HostClock) and isinstance(clock_for("cpu"), HostClock)
    assert isinstance(clock_for(CUDA, FakeCuda), CudaClock)


def test_cuda_steps_are_timed_by_events_after_draining_the_gpu():
    FakeCuda.reset()
    ran = []
    times = timed_repeats(lambda: ran.append(1), repeats=2, warmup=1, device=CUDA, cuda=FakeCuda)
    assert times == [0.25, 0.25] and len(ran) == 3
    # each call: drain the GPU, start event, (call), end event, wait for the end event
    kinds = [call[0] for call in FakeCuda.calls]
    assert kinds == ["synchronize", "record", "record", "event_synchronize"] * 3
    assert FakeCuda.calls[0] == ("synchronize", CUDA)


def test_peak_memory_is_gpu_allocated_bytes_on_cuda_and_rss_on_the_host():
    assert isinstance(peak_memory("cpu"), PeakRss)
    FakeCuda.reset(allocated=1000, peak=5000)
    with peak_memory(CUDA, FakeCuda) as window:
        assert isinstance(window, CudaPeak) and ("reset_peak", CUDA) in FakeCuda.calls
    assert (window.growth_bytes, window.method) == (4000, "cuda-max-allocated")
    assert FakeCuda.calls[-1] == ("synchronize", CUDA)  # the peak is read after the GPU finished


def test_the_pools_ranks_use_nccl_only_when_every_rank_has_its_own_gpu():
    """The worker pool's choice (a CPU pool sees no GPUs): ranks that share a GPU join with gloo."""
    assert check_backend("auto", 2, gpus=2, share_gpus=True) == "nccl"
    assert check_backend("auto", 2, gpus=1, share_gpus=True) == "gloo"
    assert check_backend("auto", 2, gpus=0, share_gpus=True) == "gloo"


def test_a_pipeline_on_cuda_needs_a_gpu_per_stage():
    check_settings(PipelineBenchSettings(device="cuda", stages=2), gpu_count=2)
    with pytest.raises(FacetrainError, match="needs a GPU per stage, 1 visible"):
        check_settings(PipelineBenchSettings(device="cuda", stages=2), gpu_count=1)


@pytest.mark.parametrize("command", ["head", "data", "train", "eval", "pipeline"])
def test_every_benchmark_refuses_cuda_without_a_gpu_in_one_line(monkeypatch, tmp_path, command):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(main, ["bench", command, "--device", "cuda", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --device cuda: torch sees no CUDA device")
    assert result.output.count("\n") == 1


def test_bench_train_times_the_linear_floor_and_reports_the_head_overhead(tmp_path):
    args = ["--classes", "50", "--world-size", "1", "--batch", "2", "--image-size", "16", "--dim", "8"]
    args += ["--heads", "sharded,tiled,linear", "--steps", "1", "--warmup", "0", "--device", "cpu"]
    result = CliRunner().invoke(train_command, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "train.json").read_text())
    rows = [(row["head"], row["classes"]) for row in report["rows"]]
    assert rows == [("sharded", 50), ("tiled", 50), ("linear", 1000)]
    assert set(report["targets"]) == {"head_overhead", "tiled_head_overhead"}
    assert report["settings"]["backend"] == "gloo" and report["machine"]["gpu"] is None


def parse_with_the_cli(argv: list[str]) -> None:
    """Resolve `facetrain a b ...` to its click command and parse every option as a run would."""
    group: click.Command = main
    names = []
    while isinstance(group, click.Group):
        name, argv = argv[0], argv[1:]
        names.append(name)
        group = group.get_command(click.Context(group), name)
        assert group is not None, f"facetrain {' '.join(names)} does not exist"
    group.make_context(" ".join(names), list(argv))


def test_the_gpu_check_plan_parses_against_the_cli(tmp_path):
    done = subprocess.run(
        [sys.executable, "tools/gpu_check.py", str(tmp_path), "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    steps = [line.split("\t") for line in done.stdout.splitlines() if not line.startswith("#")]
    commands = [shlex.split(command.split("  # skipped:")[0]) for _, _, _, command in steps]
    assert {part for _, part, _, _ in steps} == {"1", "2", "3", "4"}  # 3 and 4: issue 56's figures
    pytest_filters = [argv[argv.index("-k") + 1] for argv in commands if argv[0] == "pytest" and "-k" in argv]
    assert pytest_filters == ["head or triton", "not (head or triton)"]  # together: every cuda test
    benchmarks = {argv[2] for argv in commands if argv[0] == "facetrain"}
    assert benchmarks == {"head", "train", "data", "eval", "pipeline"}
    for argv in commands:
        if argv[0] == "facetrain":
            assert "--device" in argv and argv[argv.index("--device") + 1] == "cuda"
            parse_with_the_cli(argv[1:])


def test_the_gpu_check_runs_in_parts_by_step_number():
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(REPO / "tools"))
    assert gpu_check.step_numbers("0,2-4") == {0, 2, 3, 4}
    with pytest.raises(argparse.ArgumentTypeError, match="step numbers"):
        gpu_check.step_numbers("head")
