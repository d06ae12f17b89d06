"""fp32 to bf16 in Triton kernels, rounded as torch's cast rounds (to nearest, ties to even).

Why: Triton's interpreter (3.8), which the tests run the kernels under, truncates an fp32 to bf16 cast
whatever rounding it is asked for, so the kernels' bf16 operands would differ from the torch tiles'
there. Done in integer arithmetic, the rounding is the same on the interpreter and on a GPU; the logit
kernels take it under the interpreter only (a GPU's cast rounds to nearest even natively), the update
kernel always (one store a row element, off the dot loop). Finite values only (weights are).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bf16_nearest_even(x):
    bits = x.to(tl.uint32, bitcast=True)
    rounded = bits + (0x7FFF + ((bits >> 16) & 1))
    return (rounded >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
