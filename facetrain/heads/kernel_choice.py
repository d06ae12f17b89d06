"""Which code runs the tiled head's tiles (`head.kernel`): Triton's kernels or the torch tiles.

auto takes Triton where it pays and can run: CUDA inputs with triton importable. On the CPU Triton runs
only through its interpreter (TRITON_INTERPRET=1, far slower than the torch tiles, meant for tests), so
asking for it there without the interpreter is an error rather than a silent fallback.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from facetrain.errors import FacetrainError

KERNELS = ("auto", "triton", "torch")


@functools.cache
def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes", "y")


def resolve_kernel(requested: str, device_type: str) -> str:
    """`triton` or `torch` for a head whose inputs live on `device_type`."""
    if requested not in KERNELS:
        raise FacetrainError(f"head.kernel is one of {', '.join(KERNELS)}, not {requested!r}")
    if requested == "torch":
        return "torch"
    if requested == "auto":
        return "triton" if device_type == "cuda" and triton_available() else "torch"
    if not triton_available():
        raise FacetrainError(
            "head.kernel triton needs the triton package (pip install triton), or head.kernel torch"
        )
    if device_type != "cuda" and not interpreting():
        raise FacetrainError(
            f"head.kernel triton needs CUDA (the device is {device_type}); use head.kernel auto or torch, "
            "or TRITON_INTERPRET=1 for Triton's CPU interpreter"
        )
    return "triton"
