"""The bytes a tiled head's step moves through device memory, from its plan, and the bandwidth a copy
reaches on the same device: `facetrain bench head`'s traffic table (issue #56, item 2).

Why a model: a head with millions of classes a GPU is bound by memory, not by its GEMMs (at C 2M, D 512
its fp32 weight and momentum are 8 GB, about 4 ms at 4.3 TB/s, read and written once). Neither a
Triton kernel nor a cuBLAS GEMM reports what it read, so the step's traffic is counted from what the
code does, pass by pass: each read or write of a C x D tensor (the weight, its operand copies, the
optimizer state, the weight-gradient tiles) and of a B x C one (logits, the logit gradient) counts once
at its dtype's size; a kernel's reuse of a block across its programs is taken to hit the cache, and the
B x D tensors (independent of C, a few MiB) are left out. The passes follow
`facetrain/heads/tiled_softmax.py`, `tile_kernel.py`, `triton_tile.py`, `triton_update.py` and
`fused_optim.py` (FusedSGD); with the gradient filter, what it skips is not subtracted (an upper bound).

The floor a step cannot beat is then bytes / bandwidth, and the step's achieved bandwidth bytes / time;
`copy_bandwidth` measures the bandwidth as a large device copy does (read + write), the practical
limit of a streaming kernel on that device.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from facetrain.bench.common import timed_repeats

FLOAT_BYTES = 4  # the statistics, the weight-gradient tiles and fp32 storage
COPY_BYTES = {"cpu": 128 * 2**20, "cuda": 2**30}  # per buffer: past the caches


class Pass(NamedTuple):
    """One read or write of a tensor: what it is, and its bytes."""

    what: str
    kind: str  # "weight" (weight and optimizer state), "copies" (operand copies), "grad" (weight-gradient
    # tiles), "logits" (B x C logits and their gradient)
    nbytes: int


def tiled_passes(
    classes: int, dim: int, batch: int, storage_bytes: int, gemm_bytes: int, kernel: str
) -> list[Pass]:
    """Every pass a tiled head's step with its fused SGD (momentum) makes over C x D and B x C tensors.

    `storage_bytes` is the weight's and the momentum's (4 fp32, 2 bf16), `gemm_bytes` the GEMM operands'
    (2 under bf16 autocast, 4 in fp32), `kernel` "torch" or "triton"; CUDA's GEMMs, which read reduced
    operands and write fp32 (`heads/logit_gemm.py`)."""
    rows, logits = classes * dim, batch * classes
    wide, reduced = FLOAT_BYTES, gemm_bytes != FLOAT_BYTES
    passes: list[Pass] = []

    def add(what: str, kind: str, elements: int, each: int, times: int = 1) -> None:
        passes.extend([Pass(what, kind, elements * each)] * times)

    def current_rows(phase: str) -> None:
        """The rows in fp32 (`scratch.cast("current")`): a copy when stored in bf16."""
        if storage_bytes != wide:
            add(f"{phase}: weight rows read", "weight", rows, storage_bytes)
            add(f"{phase}: fp32 copy written, read", "copies", rows, wide, 2)
        else:
            add(f"{phase}: weight rows read", "weight", rows, wide)

    def operand_rows(phase: str) -> None:
        """The rows in the GEMM dtype, when that differs from both the storage and fp32; the GEMM reads them."""
        if reduced and gemm_bytes != storage_bytes:
            add(f"{phase}: operand copy written", "copies", rows, gemm_bytes)
        add(f"{phase}: GEMM reads the operand rows", "copies", rows, gemm_bytes)

    # Triton over fp32 rows under bf16 autocast: the logit kernels and the dX GEMM read the bf16 copy the
    # update kernel writes (heads/row_stream.py)
    stream = kernel == "triton" and storage_bytes == wide and reduced
    # forward
    if stream:
        add(
            "forward: bf16 copy of the rows read by the softmax-statistics kernel", "copies", rows, gemm_bytes
        )
    elif kernel == "triton":  # one read of the stored rows: norms and dots from the same load
        add("forward: weight rows read by the softmax-statistics kernel", "weight", rows, storage_bytes)
    else:
        current_rows("forward")
        operand_rows("forward")
        # the GEMM writes the logits; scale, max, shift, exp and sum pass over them (tile_kernel.py)
        add("forward: logits written, then 4 passes read + write and 2 reads", "logits", logits, wide, 11)
    # backward: the recomputed logits and their gradient
    if stream:
        add("backward: bf16 copy of the rows read by the logit-gradient kernel", "copies", rows, gemm_bytes)
        add("backward: logit gradient written", "logits", logits, gemm_bytes)
    elif kernel == "triton":
        add("backward: weight rows read by the logit-gradient kernel", "weight", rows, storage_bytes)
        add("backward: logit gradient written", "logits", logits, gemm_bytes)
        if storage_bytes != wide:
            add("backward: fp32 copy of the rows written", "copies", rows, wide)
        if reduced and gemm_bytes != storage_bytes:
            add("backward: operand copy written", "copies", rows, gemm_bytes)
    else:
        current_rows("backward")
        operand_rows("backward")
        add("backward: logits written, then 3 passes read + write (tile_kernel.logit_grad_tile)", "logits", logits,
            wide, 7)  # fmt: skip
        if reduced:
            add("backward: logit gradient read, written in the GEMM dtype", "logits", logits, wide)
            add("backward: logit gradient in the GEMM dtype", "logits", logits, gemm_bytes)
    add("backward: dX and dW GEMMs read the logit gradient", "logits", logits, gemm_bytes, 2)
    add("backward: dX GEMM reads the operand rows", "copies", rows, gemm_bytes)
    add("backward: dW GEMM writes the raw weight gradient", "grad", rows, wide)
    # the update
    if kernel == "triton" and storage_bytes == wide:  # triton_update.py: each read and written once
        add("update: raw gradient read", "grad", rows, wide)
        add("update: weight and momentum read, written", "weight", rows, wide, 4)
        if stream:
            add("update: the weight's bf16 copy written", "copies", rows, gemm_bytes)
        return passes
    on_storage = "weight" if storage_bytes == wide else "copies"  # bf16: the update runs on fp32 copies
    add(
        "update: radial part reads the gradient and the rows, writes and sums their product",
        "grad",
        rows,
        wide,
        4,
    )
    add("update: d_p = g - radial w + wd w (reads g and w, writes d_p)", "grad", rows, wide, 3)
    if storage_bytes != wide:
        add("update: momentum read", "weight", rows, storage_bytes)
        add("update: its fp32 copy written", "copies", rows, wide)
    add("update: buf = momentum buf + d_p (reads both, writes buf)", on_storage, rows, wide, 3)
    add("update: w -= lr buf (reads both, writes w)", on_storage, rows, wide, 3)
    if storage_bytes != wide:  # rounding.store: noise written and read, the fp32 values read, bf16 written
        for state in ("momentum", "weight"):
            add(f"update: {state} rounded stochastically", "copies", rows, wide, 3)
            add(f"update: {state} stored", "weight", rows, storage_bytes)
    return passes


def summarize_passes(passes: list[Pass]) -> dict[str, int]:
    """The passes' bytes by kind, and in all (`total`)."""
    parts = {kind: 0 for kind in ("weight", "copies", "grad", "logits")}
    for step in passes:
        parts[step.kind] += step.nbytes
    return {**parts, "total": sum(parts.values())}


@functools.cache
def copy_bandwidth(device_type: str, buffer_bytes: int | None = None, repeats: int = 5) -> float:
    """Bytes a second a device copy moves (each byte read once and written once), on this process's
    device and threads: the practical limit of a kernel that streams through memory. Once a process."""
    device = torch.device(device_type)
    elements = (buffer_bytes or COPY_BYTES[device.type]) // 4
    source = torch.ones(elements, device=device)
    target = torch.empty_like(source)
    seconds = timed_repeats(lambda: target.copy_(source), repeats, 1, device=device)
    return 2 * source.nbytes / min(seconds)


def traffic_figures(bytes_moved: int, step_s: float, bandwidth: float) -> dict[str, float]:
    """The step's traffic against the device's: achieved bandwidth, its fraction of the copy's, and the
    time the bytes would take at the copy's bandwidth (the step's memory floor)."""
    achieved = bytes_moved / step_s
    return {
        "bytes_moved": bytes_moved,
        "copy_gbs": bandwidth / 1e9,
        "achieved_gbs": achieved / 1e9,
        "bandwidth_fraction": achieved / bandwidth,
        "floor_ms": 1000 * bytes_moved / bandwidth,
    }
