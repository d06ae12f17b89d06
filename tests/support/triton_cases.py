"""What the Triton kernel tests share: the devices they run on (the CPU through Triton's interpreter,
CUDA where there is one), their fp32 bound and how they measure an error (no tests here)."""

from __future__ import annotations

import pytest
import torch

EXACT = 1e-5  # fp32, relative to the quantity's largest magnitude

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
    ),
]


def relative_error(actual, expected):
    return float((actual.double() - expected.double()).abs().max() / expected.double().abs().max())
