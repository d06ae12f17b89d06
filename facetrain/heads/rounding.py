"""Writing fp32 results into low-precision storage without losing small updates: stochastic rounding.

A bf16 weight near 1.0 moves in steps of 2^-7. An SGD step of 1e-4 rounded to nearest never moves it,
so a bf16 head trained that way stops learning as the learning rate decays. Rounding up with
probability equal to the dropped fraction (and down otherwise) makes the stored value right on
average: E[round(x)] = x, so a thousand steps of 1e-4 move the weight by 0.1 in expectation.
"""

from __future__ import annotations

import torch

_LOW_BITS = 1 << 16  # bf16 keeps the top 16 bits of an fp32
_HIGH_MASK = -_LOW_BITS  # 0xFFFF0000 as an int32


def stochastic_round_to_bf16(values: torch.Tensor) -> torch.Tensor:
    """`values` (fp32) rounded to bf16: away from zero with probability of the dropped fraction.

    Adding a uniform 16-bit integer to the fp32 bit pattern carries into the kept bits exactly when
    the dropped bits plus the noise reach 2^16; truncating then rounds the magnitude down otherwise.
    The pattern is sign and magnitude, so negative values round symmetrically; infinities stay
    infinite (their dropped bits are zero) and so do the NaNs arithmetic makes (only a NaN payload with
    its top 16 bits all set could carry over). The noise comes from the default generator of the
    values' device, so a checkpointed RNG state replays it.
    """
    values = values.to(torch.float32).contiguous()
    noise = torch.empty(values.shape, dtype=torch.int32, device=values.device).random_()
    bits = noise.bitwise_and_(_LOW_BITS - 1).add_(values.view(torch.int32)).bitwise_and_(_HIGH_MASK)
    return bits.view(torch.float32).to(torch.bfloat16)


def store(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`values` in the storage dtype: stochastically rounded into bf16, otherwise a plain cast."""
    if dtype == torch.bfloat16 and values.dtype != torch.bfloat16:
        return stochastic_round_to_bf16(values)
    return values.to(dtype)
