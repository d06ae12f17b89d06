"""build_optimizer's choice of torch's implementation: fused on GPUs, except under fp16 gradient scaling.

torch's fused SGD breaks when a GradScaler skips the first step (its momentum buffer is created but
never written); the first test shows that on the CPU, where fused SGD also exists, so the reason for
the exception is checked wherever the suite runs. If a torch release fixes it, that test fails and the
exception can go.
"""

from __future__ import annotations

import pytest
import torch

from facetrain.train.optim import OptimConfig, build_optimizer


def state_after_a_skipped_first_step(fused: bool) -> dict:
    """The optimizer's state after an fp16-style step whose gradient is infinite, which the scaler skips."""
    weight = torch.nn.Parameter(torch.ones(4))
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale((weight * torch.tensor([1.0, float("inf"), 1.0, 1.0])).sum()).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    assert torch.equal(weight.detach(), torch.ones(4))
    return optimizer.state[weight]


def test_fused_sgd_keeps_state_from_a_skipped_first_step_which_is_why_fp16_does_not_use_it():
    """A skipped step must leave the optimizer as it was. The default SGD does; the fused one creates a
    momentum buffer it never writes (torch.empty), which the next step then adds to the weight as if it
    were momentum (on an H100, an fp16 run's loss went NaN at step 5)."""
    assert state_after_a_skipped_first_step(fused=False).get("momentum_buffer") is None
    assert state_after_a_skipped_first_step(fused=True).get("momentum_buffer") is not None


def model_on(device: str) -> torch.nn.Module:
    return torch.nn.Linear(3, 2, device=device)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_cpu_parameters_get_torchs_default_implementation(name):
    optimizer = build_optimizer(OptimConfig(name=name), model_on("cpu"), None)
    assert not optimizer.defaults["fused"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_gpu_parameters_get_the_fused_implementation_except_under_grad_scaling(name):
    assert build_optimizer(OptimConfig(name=name), model_on("cuda"), None).defaults["fused"]
    assert not build_optimizer(OptimConfig(name=name), model_on("cuda"), None, grad_scaling=True).defaults[
        "fused"
    ]
