"""Whether a state dict fits a model, said as one line naming the first difference.

Loading weights from elsewhere (insightface's model zoo, an earlier run for fine-tuning) must be exact:
`load_state_dict(strict=False)` would silently leave a wrong architecture half-initialised, and torch's
own strict error lists every key over many lines.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def first_state_mismatch(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], architecture: str
) -> str | None:
    """The first missing key, else the first unexpected key, else the first wrong shape; None if it fits."""
    missing = [key for key in expected if key not in state]
    if missing:
        return f"missing {missing[0]!r} ({len(missing)} keys of {architecture} missing)"
    unexpected = [key for key in state if key not in expected]
    if unexpected:
        return f"unexpected {unexpected[0]!r} ({len(unexpected)} keys that {architecture} lacks)"
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            return f"{key!r} has shape {list(state[key].shape)}, {architecture} needs {list(tensor.shape)}"
    return None


def first_nonfinite(state: Mapping[str, torch.Tensor]) -> str | None:
    """ "'KEY' holds N NaN or infinite values of M" for the first floating-point tensor with any, or None.
    Weights loaded from a diverged or damaged file train (or teach) NaN from the first step on, which
    the trainer would otherwise blame on the learning rate."""
    for key, value in state.items():
        if torch.is_tensor(value) and value.is_floating_point():
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                return f"{key!r} holds {bad} NaN or infinite values of {value.numel()}"
    return None
