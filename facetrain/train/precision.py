"""The step's precision as torch autocast runs it: what `train.precision` names, for the trainer's step
and the benchmarks that time it. A module of its own, importing torch alone, so that a benchmark rank
that only needs the dtypes (`facetrain bench head`'s) does not import the trainer's step, its pipeline
schedules and the backbones with it (2 s of a core a rank)."""

from __future__ import annotations

import torch

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def precision_autocast(device_type: str, precision: str) -> torch.autocast:
    """`precision`'s autocast on `device_type`; fp32's is off."""
    dtype = AUTOCAST_DTYPES[precision]
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)
