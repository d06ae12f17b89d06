"""`--device` means the same to every command: auto (or no option) follows torch, cuda:N names a GPU,
CUDA without a GPU or an unknown name is one line (facetrain.devices)."""

import pytest
import torch

from facetrain.devices import rank_device, resolve_device
from facetrain.errors import FacetrainError


def test_no_device_given_is_auto():
    assert resolve_device(None, cuda_available=lambda: True) == "cuda"
    assert resolve_device(None, cuda_available=lambda: False) == "cpu"


def test_a_numbered_gpu_stays_as_given_and_needs_a_gpu():
    assert resolve_device("cuda:1", cuda_available=lambda: True) == "cuda:1"
    with pytest.raises(FacetrainError, match=r"--device cuda:1: torch sees no CUDA device"):
        resolve_device("cuda:1", cuda_available=lambda: False)


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "CPU", ""])
def test_an_unknown_device_is_one_line(name):
    with pytest.raises(FacetrainError, match=r"--device must be auto, cpu, cuda or cuda:N"):
        resolve_device(name, cuda_available=lambda: True)


def test_a_cpu_rank_runs_on_the_cpu():
    assert rank_device("cpu", 3) == torch.device("cpu")
