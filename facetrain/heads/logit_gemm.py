"""The logit GEMM in reduced precision: bf16 or fp16 operands, fp32 accumulation and fp32 output.

Under autocast a plain bf16 GEMM rounds its output to bf16: 8 significant bits, so at scale 64 a
logit near 50 is off by up to 0.125 before the softmax sees it (fp16's output, 11 bits, is 8x finer).
The operands may be rounded (the embedding and the class rows are) but the logits must not be. Where
the build has `torch.mm(..., out_dtype=)` for the device (CUDA), the GEMM writes fp32 from bf16
operands; elsewhere it runs on fp32 operands, and on the CPU with oneDNN's bf16 mode for fp32
matmuls, which rounds the operands to bf16 inside the kernel and accumulates and writes fp32 (at
B 256, D 512 and 8192 classes about 1.6x a bf16-output GEMM, against 5x for a plain fp32 one).
"""

from __future__ import annotations

import contextlib
import functools

import torch


@functools.cache
def _has_out_dtype_mm(device_type: str) -> bool:
    probe = torch.ones(1, 1, dtype=torch.bfloat16, device=device_type)
    try:
        torch.mm(probe, probe, out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


@contextlib.contextmanager
def _onednn_bf16_matmul():
    """fp32 matmuls on the CPU computed by oneDNN from bf16-rounded operands, fp32 accumulation."""
    settings = torch.backends.mkldnn.matmul
    previous = settings.fp32_precision
    settings.fp32_precision = "bf16"
    try:
        yield
    finally:
        settings.fp32_precision = previous


class LogitGemm:
    """a @ b with operands in `compute_dtype`, accumulated and written in `out_dtype`.

    `operand_dtype` is the dtype callers should hand the operands in (convert the embeddings once, the
    class rows tile by tile): the compute dtype where the device writes wide outputs itself, else the
    output dtype.
    """

    def __init__(self, device: torch.device, compute_dtype: torch.dtype, out_dtype: torch.dtype):
        self.out_dtype = out_dtype
        self.reduced = compute_dtype != out_dtype
        self.native = self.reduced and _has_out_dtype_mm(device.type)
        self.operand_dtype = compute_dtype if self.native else out_dtype
        onednn_bf16 = (
            self.reduced
            and not self.native
            and device.type == "cpu"
            and compute_dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
        )
        self._context = _onednn_bf16_matmul if onednn_bf16 else contextlib.nullcontext

    def mm(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The product in the output dtype, into `out` where given; operands in `operand_dtype`."""
        a, b = a.to(self.operand_dtype), b.to(self.operand_dtype)
        if self.native:
            return torch.mm(a, b, out_dtype=self.out_dtype, out=out)
        with self._context():
            return torch.mm(a, b, out=out)
