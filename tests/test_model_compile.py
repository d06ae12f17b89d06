"""model.compile: torch.compile of the backbone in place trains the same model as eager, and its
checkpoint keeps the backbone's parameter names (so resume, export and `--init` read it as any other)."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

from facetrain.errors import FacetrainError
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config
from tests.support.distributed import run_distributed
from tests.support.train_helpers import logged_losses, run_cli, tiny_config

NEEDS_A_COMPILER = pytest.mark.skipif(
    not (shutil.which("g++") or shutil.which("c++")), reason="no C++ compiler for inductor"
)


@pytest.mark.slow
@NEEDS_A_COMPILER
def test_a_compiled_backbone_trains_as_the_eager_one(tmp_path):
    eager = tiny_config(tmp_path, "eager", train={"steps": 3}, checkpoint={"every": 3})
    compiled = tiny_config(tmp_path, "compiled", train={"steps": 3}, checkpoint={"every": 3})
    assert run_cli("train", "-c", str(eager)).returncode == 0
    result = run_cli("train", "-c", str(compiled), "--set", "model.compile=true")
    assert result.returncode == 0, result.stderr
    # fused kernels add in another order: the same losses to rounding, not bit for bit
    assert logged_losses(tmp_path / "compiled") == pytest.approx(logged_losses(tmp_path / "eager"), rel=1e-4)
    exported = run_cli("export", str(tmp_path / "compiled"), "-o", str(tmp_path / "export"))
    assert exported.returncode == 0, exported.stderr


def test_compile_on_a_cpu_without_a_compiler_is_one_line(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    cfg = Config()
    cfg.model.compile = True
    with pytest.raises(FacetrainError, match=r"model.compile = True: on a CPU needs a C\+\+ compiler"):
        validate(cfg, 1, device_type="cpu")
    validate(cfg, 1, device_type="cuda")  # CUDA kernels come from Triton, not a C++ compiler


def compiled_ddp_step_warnings(rank: int, world_size: int) -> list[str]:
    """One training step of the small backbone wrapped in DDP and compiled as `facetrain.train.setup`
    does (faces_small's: compiled, parameters in the default layout); the warnings it raised."""
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone="small", embedding_size=8), (16, 16))
    model = wrap_data_parallel(backbone, torch.device("cpu"))
    backbone.compile()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(torch.randn(4, 3, 16, 16)).square().sum().backward()
    assert all(parameter.grad is not None for parameter in backbone.parameters())
    return [str(warning.message) for warning in caught]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two ranks compile at once: 3-10 minutes each on 2 busy cores
@NEEDS_A_COMPILER
def test_a_compiled_backbone_under_ddp_gets_its_gradients_without_a_layout_warning():
    """The compiled backward hands the 1x1 convolutions' weight gradients in channels_last strides;
    they reach DDP's buckets without torch's "Grad strides do not match bucket view strides" warning
    on each rank (issue 58). Measured when written: both ranks warned before
    `gradient_as_bucket_view`; with model.channels_last neither did, before or after."""
    per_rank = run_distributed(compiled_ddp_step_warnings, 2, timeout=1100)
    assert [[text for text in caught if "bucket view strides" in text] for caught in per_rank] == [[], []]
