"""Optimizer state through a checkpoint: equal to what was saved, placed where torch.optim places it."""

from __future__ import annotations

import pytest
import torch

from facetrain.checkpoint import CheckpointStates
from facetrain.checkpoint.app_state import set_optimizer_state
from facetrain.checkpoint.reader import load_checkpoint
from facetrain.checkpoint.writer import save_checkpoint
from facetrain.heads import ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train.optim import build_optimizer
from facetrain.train.run_config import Config
from facetrain.train.state import TrainState

NUM_CLASSES, DIM = 9, 6


def config(optimizer: str) -> Config:
    cfg = Config()
    cfg.model.embedding_size = DIM
    cfg.optim.name = optimizer
    cfg.optim.lr = 0.01
    return cfg


def build(cfg: Config, seed: int, device: str = "cpu"):
    torch.manual_seed(seed)
    backbone = torch.nn.Sequential(torch.nn.Linear(4, DIM), torch.nn.BatchNorm1d(DIM)).to(device)
    head = ShardedMarginHead(NUM_CLASSES, DIM, margin="cosface")
    head.reset_parameters(seed=seed)
    head = head.to(device)
    return backbone, head, build_optimizer(cfg.optim, backbone, head)


def take_step(backbone, head, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    device = head.weight.device
    images = torch.randn(8, 4, generator=generator).to(device)
    labels = torch.randint(0, NUM_CLASSES, (8,), generator=generator).to(device)
    loss, _ = head(backbone(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def trained_and_resumed(tmp_path, optimizer: str, device: str = "cpu"):
    """A model trained 3 steps and checkpointed, and a differently initialised one resumed from it."""
    cfg = config(optimizer)
    trained = build(cfg, seed=0, device=device)
    for step in range(3):
        take_step(*trained, seed=step)
    backbone, head, opt = trained
    names = [str(i) for i in range(NUM_CLASSES)]
    states = CheckpointStates(TrainState(step=3), cfg, names, backbone, head, opt, None)
    save_checkpoint(tmp_path, init_parallel(), states)
    resumed = build(cfg, seed=1, device=device)
    load_checkpoint(tmp_path, init_parallel(), resumed[0], resumed[1], resumed[2], None)
    return trained, resumed


def parameters(backbone, head) -> list[torch.nn.Parameter]:
    return [*backbone.parameters(), head.weight]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_resumed_state_equals_the_saved_state_and_the_next_step_is_identical(tmp_path, optimizer):
    trained, resumed = trained_and_resumed(tmp_path, optimizer)
    expected_keys = {"sgd": {"momentum_buffer"}, "adamw": {"step", "exp_avg", "exp_avg_sq"}}[optimizer]
    for saved, loaded in zip(parameters(*trained[:2]), parameters(*resumed[:2])):
        saved_state, loaded_state = trained[2].state[saved], resumed[2].state[loaded]
        assert set(loaded_state) == expected_keys
        for key, value in saved_state.items():
            assert torch.equal(loaded_state[key], value), key
    take_step(*trained, seed=10)
    take_step(*resumed, seed=10)
    for saved, loaded in zip(parameters(*trained[:2]), parameters(*resumed[:2])):
        assert torch.equal(saved, loaded)


def test_resumed_adamw_step_is_a_cpu_float32_scalar_like_torchs_own(tmp_path):
    trained, resumed = trained_and_resumed(tmp_path, "adamw")
    for saved, loaded in zip(parameters(*trained[:2]), parameters(*resumed[:2])):
        own, step = trained[2].state[saved]["step"], resumed[2].state[loaded]["step"]
        assert (step.device.type, step.dtype, step.dim()) == ("cpu", torch.float32, 0)
        assert (step.device, step.dtype, step.shape) == (own.device, own.dtype, own.shape)
        assert step.item() == 3


def test_restored_state_follows_its_parameter_but_step_stays_on_the_cpu():
    """Parameters on another device (meta stands in for a GPU on a CPU-only machine): the moments go
    with the parameter, the step counter stays where torch.optim keeps it."""
    weight = torch.nn.Parameter(torch.empty(3, 2, device="meta"))
    optimizer = torch.optim.AdamW([weight])
    moments = {"exp_avg": torch.ones(3, 2), "exp_avg_sq": torch.full((3, 2), 2.0)}
    parts = torch.nn.ParameterDict({"weight": weight})
    set_optimizer_state(parts, optimizer, {"weight": {"step": torch.tensor(5, dtype=torch.int64), **moments}})
    state = optimizer.state[weight]
    assert (state["step"].device.type, state["step"].dtype, state["step"].item()) == ("cpu", torch.float32, 5)
    assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_adamw_resumed_on_cuda_keeps_step_where_torch_puts_it(tmp_path):
    """On a GPU the trainer's AdamW is torch's fused one, which keeps `step` on the device; the resumed
    optimizer's `step` must be where a never-interrupted one has it, before and after the next step."""
    trained, (backbone, head, optimizer) = trained_and_resumed(tmp_path, "adamw", device="cuda")
    assert optimizer.defaults["fused"]
    for saved, loaded in zip(parameters(*trained[:2]), parameters(backbone, head)):
        own, step = trained[2].state[saved]["step"], optimizer.state[loaded]["step"]
        assert (step.device, step.dtype, step.shape) == (own.device, own.dtype, own.shape)
        assert optimizer.state[loaded]["exp_avg"].device.type == "cuda"
    take_step(backbone, head, optimizer, seed=10)
    assert all(optimizer.state[param]["step"].device.type == "cuda" for param in parameters(backbone, head))
