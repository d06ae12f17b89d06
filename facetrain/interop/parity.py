"""Checks that an exported model computes what the eager backbone computes.

Random inputs in the normalized pixel range stand in for images: what matters is that every layer is
exercised with realistic magnitudes. Two batch sizes, neither the one traced with, prove that the
batch axis really is dynamic.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from facetrain.errors import FacetrainError

TOLERANCE = 1e-4
TRACE_BATCH = 2
CHECK_BATCHES = (1, 3)


def example_batch(image_size: tuple[int, int], batch: int = TRACE_BATCH, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, *image_size, generator=generator) * 2 - 1


def check_outputs(
    reference: nn.Module,
    candidate: Callable[[torch.Tensor], torch.Tensor | np.ndarray],
    image_size: tuple[int, int],
    name: str,
    tolerance: float = TOLERANCE,
) -> float:
    """The largest absolute difference over the check batches; a FacetrainError when a row's difference
    is above `tolerance` of the row's scale (its largest value, at least 1). An absolute bound refused
    a random iresnet18 whose embeddings have norms of 6e8 for float32's rounding (1e-6 of them); a
    relative one alone would demand exactness of outputs near zero."""
    worst = worst_scaled = 0.0
    with torch.no_grad():
        for seed, batch in enumerate(CHECK_BATCHES, start=1):
            inputs = example_batch(image_size, batch, seed)
            expected = reference(inputs).float()
            actual = torch.as_tensor(candidate(inputs)).float()
            if actual.shape != expected.shape:
                raise FacetrainError(
                    f"the {name} export gives shape {tuple(actual.shape)} for a batch of {batch}, "
                    f"PyTorch {tuple(expected.shape)}; leave {name.lower()} out of --formats"
                )
            difference = (actual - expected).abs().flatten(1).amax(dim=1)
            scale = expected.abs().flatten(1).amax(dim=1).clamp(min=1.0)
            worst = max(worst, float(difference.max()))
            worst_scaled = max(worst_scaled, float((difference / scale).max()))
    if not worst_scaled <= tolerance:
        raise FacetrainError(
            f"the {name} export differs from PyTorch by {worst_scaled:.3g} of its outputs' scale (> {tolerance:g}); "
            f"leave {name.lower()} out of --formats or report the backbone as unsupported"
        )
    return worst
