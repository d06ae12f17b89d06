"""The tiled head in training: checkpoints resharded N -> M, switching modes on resume, the trainer."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from facetrain.checkpoint import CheckpointStates
from facetrain.checkpoint.reader import load_checkpoint
from facetrain.checkpoint.writer import save_checkpoint
from facetrain.cli import main
from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train import head_plan
from facetrain.train.optim import build_fused_optimizer, build_optimizer, head_learning_rate
from facetrain.train.run_config import Config
from facetrain.train.state import TrainState
from tests.support.distributed import run_distributed
from tests.support.train_helpers import logged_losses, run_cli, tiny_config

NUM_CLASSES, DIM = 11, 6


def build(mode: str, seed: int, state_dtype=torch.float32):
    """A backbone and a head in `mode` ("untiled", or "tiled" with its fused SGD) with the trainer's
    optimizer; the head's weight is drawn the same whatever the world size."""
    cfg = Config()
    torch.manual_seed(seed)
    backbone = torch.nn.Sequential(torch.nn.Linear(4, DIM))
    plan = (
        HeadPlan("tiled", 4, state_dtype=state_dtype, fused_optimizer=True) if mode == "tiled" else HeadPlan()
    )
    head = ShardedMarginHead(NUM_CLASSES, DIM, margin="cosface", plan=plan)
    head.reset_parameters(seed=seed)
    if mode == "tiled":
        head.fuse_optimizer(build_fused_optimizer(cfg.optim, head, state_dtype))
    return backbone, head, build_optimizer(cfg.optim, backbone, head)


def momentum_of(head, optimizer) -> torch.Tensor:
    if head.fused_optimizer is not None:
        return head.fused_optimizer.state[head.weight]["momentum_buffer"].float()
    return optimizer.state[head.weight]["momentum_buffer"]


def save_worker(rank, world_size, run_dir, mode, state_dtype):
    backbone, head, optimizer = build(mode, seed=0, state_dtype=state_dtype)
    generator = torch.Generator().manual_seed(rank)
    for _ in range(2):
        loss, _ = head(backbone(torch.randn(4, 4, generator=generator)), torch.tensor([0, 3, 5, 10]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    cfg = Config()
    cfg.model.embedding_size = DIM
    classes = [str(i) for i in range(NUM_CLASSES)]
    states = CheckpointStates(TrainState(step=2), cfg, classes, backbone, head, optimizer, None)
    save_checkpoint(run_dir, init_parallel(), states)
    return head.weight.detach(), momentum_of(head, optimizer)


def load_worker(rank, world_size, run_dir, mode, state_dtype=torch.float32):
    backbone, head, optimizer = build(mode, seed=1, state_dtype=state_dtype)
    load_checkpoint(run_dir, init_parallel(), backbone, head, optimizer, None)
    return head.weight.detach(), momentum_of(head, optimizer)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two-rank checkpoints: the tiled head with its fused SGD (bf16 momentum), and the untiled head."""
    runs = {}
    for mode, state_dtype in (("tiled", torch.bfloat16), ("untiled", torch.float32)):
        run_dir = tmp_path_factory.mktemp(mode)
        per_rank = run_distributed(save_worker, 2, run_dir, mode, state_dtype)
        runs[mode] = (run_dir, *(torch.cat(parts) for parts in zip(*per_rank)))
    return runs


def assert_loaded(per_rank, weight, momentum):
    assert torch.equal(torch.cat([w for w, _ in per_rank]), weight)
    assert torch.equal(torch.cat([m for _, m in per_rank]), momentum)


def test_fused_checkpoint_reshards_two_to_one_and_three(saved):
    run_dir, weight, momentum = saved["tiled"]
    assert_loaded([load_worker(0, 1, run_dir, "tiled", torch.bfloat16)], weight, momentum)
    assert_loaded(run_distributed(load_worker, 3, run_dir, "tiled", torch.bfloat16), weight, momentum)


def test_runs_switch_modes_on_resume(saved):
    """Both modes write and read the same entries (optim/head/momentum_buffer/<range>)."""
    run_dir, weight, momentum = saved["tiled"]
    assert_loaded([load_worker(0, 1, run_dir, "untiled")], weight, momentum)  # bf16 -> fp32: exact
    run_dir, weight, momentum = saved["untiled"]
    assert_loaded([load_worker(0, 1, run_dir, "tiled")], weight, momentum)


def test_the_trainer_optimizer_leaves_a_fused_head_alone():
    backbone, head, optimizer = build("tiled", seed=0)
    groups = {group["name"]: group for group in optimizer.param_groups}
    assert groups["head"]["params"] == [] and head_learning_rate(optimizer) == Config().optim.lr
    assert len(groups["backbone"]["params"]) == 2


@pytest.mark.slow
def test_trainer_runs_the_tiled_bf16_head_and_resumes_untiled(tmp_path):
    config = tiny_config(
        tmp_path,
        "run",
        head={"mode": "tiled", "tile_classes": 5, "weight_dtype": "bf16", "state_dtype": "bf16"},
        optim={"lr": 0.05, "schedule": "polynomial"},
    )
    result = run_cli("train", "-c", str(config), "--nproc", "2")
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "head: tiled, 5 classes a tile, fused sgd, weight bf16, state bf16; 6 of 12 classes" in output
    losses = logged_losses(tmp_path / "run")
    assert len(losses) == 6 and all(0 < loss < 100 for loss in losses)
    resumed = run_cli(
        "train", "-c", str(config), "--resume", "auto", "--set", "train.steps=8",
        "--set", "head.mode=untiled", "--set", "head.weight_dtype=fp32", "--set", "head.state_dtype=fp32",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "head: untiled, torch sgd, weight fp32; 12 of 12 classes" in resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout + resumed.stderr and len(logged_losses(tmp_path / "run")) == 8


FP32_FIX = "or store the head in fp32 (head.weight_dtype, head.state_dtype)"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["head.mode=untiled", "head.weight_dtype=bf16"], "head.weight_dtype = 'bf16': needs the tiled"),
        (
            ["head.fused_optimizer=false", "head.state_dtype=bf16"],
            "head.state_dtype = 'bf16': needs the tiled",
        ),
        (
            ["head.state_dtype=bf16", "optim.grad_accumulation=2"],
            "optim.grad_accumulation = 2: must be 1 with",
        ),
        (["head.weight_dtype=bf16", "train.precision=fp16"], "train.precision = 'fp16': cannot be used"),
        (
            ["head.weight_dtype=bf16", "parallel.pipeline_stages=2", "parallel.microbatches=2"],
            "parallel.microbatches = 2: must be 1 with",
        ),
    ],
)
def test_bf16_storage_without_its_fused_optimizer_is_a_one_line_error(tmp_path, overrides, message):
    config = tiny_config(tmp_path, "run")
    args = [arg for override in overrides for arg in ("--set", override)]
    result = CliRunner().invoke(main, ["config", "-c", str(config), *args])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and message in result.output
    assert ("needs the tiled" in message) != (FP32_FIX in result.output)


@pytest.mark.parametrize(
    ("requested", "free_bytes", "accumulation", "mode", "fused", "why"),
    [
        ("auto", 10**12, 1, "untiled", False, "head.mode auto, 931.3 GiB free"),
        ("auto", 1, 1, "tiled", True, "head.mode auto, 0.0 GiB free"),
        (
            "auto",
            1,
            2,
            "tiled",
            False,
            "head.mode auto, 0.0 GiB free; no fused optimizer with optim.grad_accumulation 2",
        ),
        ("tiled", 1, 2, "tiled", False, "no fused optimizer with optim.grad_accumulation 2"),
        ("tiled", 1, 1, "tiled", True, ""),
    ],
)
def test_the_head_plan_is_resolved_once_and_logged(
    monkeypatch, capsys, requested, free_bytes, accumulation, mode, fused, why
):
    """head.mode auto: untiled when it fits, else tiled. A setting the fused optimizer cannot honour
    (here gradient accumulation) turns it off in every mode, and the line says which; the head gets
    the plan as it was logged."""
    monkeypatch.setattr(head_plan, "free_memory_bytes", lambda device: free_bytes)
    cfg = Config()
    cfg.model.embedding_size, cfg.optim.grad_accumulation, cfg.head.mode = DIM, accumulation, requested
    head = head_plan.build_head(cfg, NUM_CLASSES, init_parallel())
    assert (head.plan.mode, head.plan.fused_optimizer, head.plan.tile_classes) == (mode, fused, 8192)
    assert (head.fused_optimizer is not None) == fused
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"head: {'tiled, 8,192 classes a tile' if mode == 'tiled' else 'untiled'}")
    assert (f"({why})" in line) if why else ("(" not in line.split(";")[0])
