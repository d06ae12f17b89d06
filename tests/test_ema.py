"""model.ema_decay: the weight average against a plain reference, and in training: verified, checkpointed
as the backbone (the trained weights beside it) and read back as the model (`load_model`, what
export and eval use). That it resumes exactly is tests/test_resume_exact.py's."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from facetrain.checkpoint import resolve_checkpoint
from facetrain.checkpoint.names import BACKBONE, EMA
from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.verify_pairs import load_pairs, verify
from facetrain.interop import load_model
from facetrain.train.ema import WeightEma
from facetrain.train.run_config import checkpoint_config
from tests.support.fault_helpers import checkpoint_tensors
from tests.support.train_helpers import run_cli, tiny_config


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.BatchNorm1d(4), nn.PReLU(4)).double()


def test_average_matches_the_plain_formula_with_its_warmup():
    net = small_net()
    ema = WeightEma(net, decay=0.9)
    reference = {k: v.clone() for k, v in net.state_dict().items()}
    generator = torch.Generator().manual_seed(1)
    for update in range(1, 100):  # the decay warms up to 0.9 at the 81st
        with torch.no_grad():
            for param in net.parameters():
                param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype))
        net.train()(torch.randn(6, 5, generator=generator, dtype=torch.float64))  # moves batch-norm stats
        ema.update(net)
        decay = min(0.9, (1 + update) / (10 + update))
        for key, value in net.state_dict().items():
            if value.is_floating_point():
                reference[key] = decay * reference[key] + (1 - decay) * value
            else:
                reference[key] = value.clone()
    assert ema.updates == 99 and ema.current_decay() == 0.9
    for key, value in ema.module.state_dict().items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=1e-12, msg=key)
    assert int(ema.module.state_dict()["1.num_batches_tracked"]) == 99  # copied, not averaged
    assert not ema.module.training and not any(p.requires_grad for p in ema.module.parameters())
    assert all(
        a.data_ptr() != b.data_ptr() for a, b in zip(ema.module.parameters(), net.parameters())
    )  # a copy, not a view of the live weights


RECIPE = {
    "model": {"backbone": "small", "embedding_size": 32, "ema_decay": 0.9},
    "head": {"margin": "arcface", "scale": 16.0, "margin_params": {"m": 0.3}, "margin_warmup_steps": 4},
}


@pytest.mark.slow
def test_training_verifies_and_reads_back_the_average(tmp_path):
    pairs = str(tmp_path / "synth" / "heldout" / "pairs.txt")
    config = tiny_config(tmp_path, "run", **RECIPE, eval={"pairs": pairs}, train={"steps": 6})
    result = run_cli("train", "-c", str(config), "--nproc", "2")
    assert result.returncode == 0, result.stderr

    # the checkpoint's backbone is the average, and it is what was verified and what load_model reads
    run = tmp_path / "run"
    average, trained = checkpoint_tensors(run, EMA), checkpoint_tensors(run, BACKBONE)
    assert any(not torch.equal(average[k], trained[k]) for k in average if average[k].is_floating_point())
    config = checkpoint_config(resolve_checkpoint(run))
    backbone = load_model(run).module
    for name, tensor in backbone.state_dict().items():
        assert torch.equal(tensor, average[name]), name
    evaluation = json.loads((run / "summary.json").read_text())["evaluation"]
    outcome = verify(
        load_pairs(pairs), backbone, EmbedSettings(tuple(config.data.image_size), progress=False)
    )
    assert evaluation["xnorm"] == pytest.approx(outcome.xnorm, rel=1e-5)
    assert evaluation["accuracy"] == pytest.approx(outcome.accuracy, abs=1e-9)
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
