"""Checkpoints of facetrain's first format (tests/data/checkpoint_v1, written by 2 ranks) still resume:
on 1 and 3 ranks, the weights, step, optimizer state, weight average and scaler equal what was saved."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from facetrain.checkpoint import load_backbone_weights, load_full_head
from facetrain.checkpoint.reader import load_checkpoint, load_ema_weights
from facetrain.heads import ShardedMarginHead
from facetrain.parallel.dims import init_parallel
from facetrain.train.ema import WeightEma
from facetrain.train.optim import build_fused_optimizer, build_optimizer
from facetrain.train.run_config import Config
from tests.support.distributed import run_distributed
from tests.support.head_plans import head_plan

DATA = Path(__file__).parent / "data" / "checkpoint_v1"
NUM_CLASSES, DIM = 11, 6
KINDS = ("untiled_sgd", "tiled_adamw")


def resume(rank, world_size, kind):
    """A differently seeded model resumed from the first-format checkpoint; what it then holds."""
    tiled = kind == "tiled_adamw"
    cfg = Config()
    cfg.model.embedding_size, cfg.optim.name, cfg.optim.lr = DIM, "adamw" if tiled else "sgd", 0.05
    torch.manual_seed(5)
    backbone = torch.nn.Sequential(torch.nn.Linear(4, DIM), torch.nn.BatchNorm1d(DIM))
    head = ShardedMarginHead(
        NUM_CLASSES, DIM, margin="cosface", plan=head_plan(4 if tiled else None, fused=tiled)
    )
    head.reset_parameters(seed=5)
    if tiled:
        head.fuse_optimizer(build_fused_optimizer(cfg.optim, head, torch.float32))
    optimizer = build_optimizer(cfg.optim, backbone, head)
    scaler = None if tiled else torch.amp.GradScaler("cpu", init_scale=1.0)
    state = load_checkpoint(DATA / kind, init_parallel(), backbone, head, optimizer, scaler)
    ema = WeightEma(backbone, 0.5)
    has_average = load_ema_weights(DATA / kind, ema.module)
    head_state = (head.fused_optimizer or optimizer).state[head.weight]
    named = dict(backbone.named_parameters())
    return {
        "state": state,
        "rows": (head.class_start, head.class_count),
        "head/weight": head.per_class(head.weight.detach()),
        **{f"head_state/{k}": head.per_class(v) if v.dim() else v for k, v in head_state.items()},
        **{f"backbone/{k}": v for k, v in backbone.state_dict().items()},
        **{f"backbone_state/{n}/{k}": v for n, p in named.items() for k, v in optimizer.state[p].items()},
        **({f"ema/{k}": v for k, v in ema.module.state_dict().items()} if has_average else {}),
        **({"scaler/scale": torch.tensor(scaler.get_scale())} if scaler is not None else {}),
    }


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [1, 3])
def test_a_first_format_checkpoint_resumes_with_what_it_saved(kind, world_size):
    expected = torch.load(DATA / f"{kind}_expected.pt", weights_only=True)
    per_rank = [resume(0, 1, kind)] if world_size == 1 else run_distributed(resume, world_size, kind)
    for got in per_rank:
        assert (got["state"]["step"], got["state"]["epoch"], got["state"]["consumed"]) == (3, 1, 24)
        start, count = got["rows"]
        for key, want in expected.items():
            if key.startswith("head") and want.dim():
                want = want[start : start + count]
            assert key in got, key
            assert got[key].dtype == want.dtype and torch.equal(got[key], want), key
        assert set(got) - set(expected) == {"state", "rows"}


def test_a_first_format_checkpoint_exports_its_average_and_full_head():
    expected = torch.load(DATA / "untiled_sgd_expected.pt", weights_only=True)
    backbone = torch.nn.Sequential(torch.nn.Linear(4, DIM), torch.nn.BatchNorm1d(DIM))
    load_backbone_weights(DATA / "untiled_sgd", backbone)
    for key, value in backbone.state_dict().items():
        assert torch.equal(value, expected[f"ema/{key}"]), key
    assert torch.equal(load_full_head(DATA / "untiled_sgd"), expected["head/weight"])
