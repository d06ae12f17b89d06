"""Reused buffers for the head's kernels: where the CPU allocator's behaviour shapes the code, in one place.

glibc serves blocks of 16 MiB and more from mmap until a freed one raises its threshold; after that they
come from the heap, and fresh tile- or block-sized temporaries allocated between the small tensors a
step keeps fragment it (the process grew by up to 160 MiB at C = 100k, by 0.5 GiB at C = 2M in bf16).
A fresh buffer per tile also costs its page faults (a few ms a tile on the CPU, a quarter of an
elementwise pass over it). So the kernels take every temporary whose size is a tile's or a block's from
a `Scratch`, which hands out the same named buffer each time it is asked.
"""

from __future__ import annotations

import torch

ROWWISE_BLOCK = 8192  # rows a block of `Scratch.rowwise_dot`: one block x D product buffer


class Scratch:
    """Named buffers on one device, grown when asked for more and reused otherwise."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        buffer = self.buffers.get(name)
        if buffer is None or buffer.numel() < rows * cols or buffer.dtype != dtype:
            buffer = self.buffers[name] = torch.empty(rows * cols, dtype=dtype, device=self.device)
        return buffer[: rows * cols].view(rows, cols)

    def cast(self, name: str, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`values` in `dtype`: itself when it is already, else a copy in the named buffer."""
        if values.dtype == dtype:
            return values
        return self.get(name, *values.shape, dtype).copy_(values)

    def mm(self, name: str, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """a @ b as `dtype`, into the named buffer when no conversion is needed."""
        if a.dtype != dtype:
            return torch.mm(a, b).to(dtype)
        return torch.mm(a, b, out=self.get(name, a.shape[0], b.shape[1], dtype))

    def rowwise_dot(self, a: torch.Tensor, b: torch.Tensor, block: int = ROWWISE_BLOCK) -> torch.Tensor:
        """sum(a * b, dim=1), `block` rows at a time, product and result in scratch buffers: einsum's
        batched GEMM is several times slower on the CPU, and a whole-shard product would be a second
        weight-sized buffer. The result lives until the next call."""
        rows, dtype = a.shape[0], torch.result_type(a, b)
        out = self.get("rowwise_sum", rows, 1, dtype).view(rows)
        product = self.get("rowwise_product", min(block, rows), a.shape[1], dtype)
        for start in range(0, rows, block):
            stop = min(start + block, rows)
            piece = product[: stop - start]
            torch.sum(torch.mul(a[start:stop], b[start:stop], out=piece), dim=1, out=out[start:stop])
        return out
