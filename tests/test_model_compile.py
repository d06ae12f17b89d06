"""model.compile: torch.compile of the backbone in place trains the same model as eager, and its
checkpoint keeps the backbone's parameter names (so resume, export and `--init` read it as any other)."""

from __future__ import annotations

import shutil

import pytest

from facetrain.errors import FacetrainError
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config
from tests.support.train_helpers import logged_losses, run_cli, tiny_config


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")), reason="no C++ compiler for inductor")
def test_a_compiled_backbone_trains_as_the_eager_one(tmp_path):
    eager = tiny_config(tmp_path, "eager", train={"steps": 3, "checkpoint_every": 3})
    compiled = tiny_config(tmp_path, "compiled", train={"steps": 3, "checkpoint_every": 3})
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
