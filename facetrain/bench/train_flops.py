"""Model FLOPs utilisation for `facetrain bench train`: the step's FLOPs against a GEMM peak measured on
the same device.

FLOPs are counted by torch's `FlopCounterMode` over one forward and backward on the meta device (shapes
only: nothing is computed, so r50 at C = 2M counts in a second on any machine). The margin heads are
counted on the dense reference head, which computes the same products as the sharded and tiled heads
(whose Triton kernels a counter of aten operators would not see); the linear head is counted as it
is. Per image, so the figure does not depend on the batch or on how the classes are split over ranks.

The peak is what a square GEMM reaches on the device (the best of a few timed calls), not a
datasheet's figure: MFU then says how far the step is from what this device's matrix units can do, in
the same units. It is the faster of the step's precision and fp32: on a CPU without bf16 units a bf16
GEMM is emulated, up to hundreds of times slower than fp32 (a GEMM peak below the step's own rate gave
MFUs of 500-800 %), and the hardware's limit for the step's arithmetic is then fp32's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from facetrain.bench.common import timed_repeats
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.train.precision import AUTOCAST_DTYPES

# Side of the square GEMM timed for the peak: large enough to reach the matrix units' rate (a GPU
# needs thousands; on a CPU 1024 already runs at the rate of its vector units) and short to time.
GEMM_SIDE = {"cuda": 8192, "cpu": 1024}
BACKBONE_COUNT_BATCH = 2  # images the meta forward runs; the count is per image


def flops_per_image(backbone: str, image_size: int, dim: int, head: nn.Module | None = None) -> float:
    """FLOPs of one image's forward and backward through `backbone` and, when given, `head` (built on
    the meta device: its C x D weight then takes no memory)."""
    with torch.device("meta"):
        model = build_backbone(ModelConfig(backbone=backbone, embedding_size=dim), (image_size, image_size))
        images = torch.empty(BACKBONE_COUNT_BATCH, 3, image_size, image_size)
        labels = torch.zeros(BACKBONE_COUNT_BATCH, dtype=torch.int64)
    with FlopCounterMode(display=False) as counter:
        embeddings = model(images)
        loss = embeddings.float().sum() if head is None else head(embeddings, labels)[0]
        loss.backward()
    return counter.get_total_flops() / BACKBONE_COUNT_BATCH


def gemm_peak_flops(device: torch.device, precision: str, side: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of the fastest of `repeats` side x side GEMMs in `precision`'s dtype on `device`."""
    side = side or GEMM_SIDE.get(device.type, GEMM_SIDE["cpu"])
    dtype = AUTOCAST_DTYPES[precision] or torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(side, side, device=device, dtype=dtype, generator=generator)
    b = torch.randn(side, side, device=device, dtype=dtype, generator=generator)
    times = timed_repeats(lambda: torch.mm(a, b), repeats, warmup=2, device=device)
    return 2 * side**3 / min(times)


def device_peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """The GEMM peak MFU is taken against, and the precision that reached it: the faster of
    `precision`'s and fp32's."""
    peaks = {name: gemm_peak_flops(device, name) for name in dict.fromkeys((precision, "fp32"))}
    best = max(peaks, key=peaks.get)
    return peaks[best], best


def utilisation(flops_per_image_: float, images_per_s: float, peak_flops: float) -> dict:
    """The step's achieved FLOP/s and its fraction of `peak_flops` (all the devices the ranks used)."""
    achieved = flops_per_image_ * images_per_s
    return {"achieved_flops": achieved, "mfu": achieved / peak_flops}
