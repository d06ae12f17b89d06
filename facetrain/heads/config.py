"""The `head` section of a run's config: the margin and how the class-sharded head stores and computes
its logits; the margin is checked against the margins this package registers, its parameters by the
margin itself.

`facetrain.heads` does not import this module: the head is a library that takes plain arguments, and
the training run builds it from this section (`facetrain.train.head_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from facetrain.config.checks import OneOf, Registered, Within, above, at_least, setting
from facetrain.config.validate import Problem
from facetrain.errors import FacetrainError
from facetrain.heads.margins import MARGINS, build_margin


@dataclass
class HeadConfig:
    # a margin registered in facetrain/heads/margins/ (MARGINS; docs/head.md describes each, and a name
    # that is not one is refused with the list): not listed here, where it went stale
    margin: str = setting("arcface", Registered(MARGINS))
    scale: float = setting(64.0, above(0))
    # random: N(0, 0.01) rows | class_means: a fine-tune's (model.init) rows start at each class's mean
    # embedding under the starting network, one pass over the data before step 1 (weight imprinting,
    # facetrain/heads/imprint.py)
    init: str = setting("random", OneOf(("random", "class_means")))
    # Partial-FC negative sampling; 1.0 is the full head
    sample_rate: float = setting(1.0, Within(0, 1, "(]"))
    # e.g. {m: 0.5} or {m1: 1, m2: 0.3, m3: 0.2}; checked against the margin's parameters
    margin_params: dict[str, float] = field(default_factory=dict)
    # the margin grows linearly from none (plain normalised softmax) to its full value over these steps
    margin_warmup_steps: int = setting(0, at_least(0))
    # label smoothing (torch's cross_entropy label_smoothing, on the margin's logits): eps of each row's
    # target mass spread over the step's classes, exact in the sharded head (one more B-sized
    # statistic); Bag of Tricks' re-id recipe uses 0.1. The tiled head runs it on the torch tiles
    label_smoothing: float = setting(0.0, Within(0, 1, "[)"))
    # sub-center ArcFace: K centres a class, a class's cosine is its nearest centre's; K > 1 lets a class
    # with noisy or varied photos keep its outliers on a centre of their own (untiled head only)
    sub_centers: int = setting(1, Within(1, 1024))
    # untiled (fastest: one B x C/N logit buffer) | tiled (B x tile_classes logits at a time) | auto:
    # untiled when its weight, gradient, optimizer state and logits fit in half the free device memory
    mode: str = setting("auto", OneOf(("auto", "untiled", "tiled")))
    # classes per tile of the tiled head; null: the device's size (8192 on CPU, 65536 on CUDA), see
    # facetrain/train/device_defaults.py
    tile_classes: int | None = setting(None, at_least(1))
    # tiled: each tile's elementwise work as torch.compile'd fused kernels (fewer launches on a GPU)
    compile_tiles: bool = False
    # tiled: what runs each tile; auto: Triton kernels (logit GEMM fused with the softmax statistics and
    # the logit gradient) when the device is CUDA and triton imports, else the torch tiles; triton on
    # the CPU needs TRITON_INTERPRET=1 (tests), see facetrain/heads/triton_tile.py
    kernel: str = setting("auto", OneOf(("auto", "triton", "torch")))
    # tiled: the head updates each tile's rows inside the backward, so no C x D gradient exists; false
    # keeps a gradient for the trainer's optimizer, as settings it cannot honour do by themselves
    # (grad_accumulation > 1, fp16, pipeline micro-batches; train/run_config.fused_optimizer_conflict)
    fused_optimizer: bool = True
    # storage of the weight and of the fused optimizer's state (momentum, AdamW's moments); bf16 is
    # updated with stochastic rounding and needs the fused optimizer
    weight_dtype: str = setting("fp32", OneOf(("fp32", "bf16")))
    state_dtype: str = setting("fp32", OneOf(("fp32", "bf16")))
    # tiled: skip the backward's blocks of logit gradient whose every probability (|softmax - onehot|,
    # times a margin's slopes) is below this, as Cut Cross-Entropy's filter_eps (its bf16 default is
    # 0.000244 = 2^-12). Approximate: dX and dW lose what was skipped (docs/head.md, "The gradient
    # filter"); the loss is unchanged. 0 (default): off, exact
    gradient_filter: float = setting(0.0, Within(0, 1, "[)"))

    def low_precision_keys(self) -> list[str]:
        """The storage settings (weight_dtype, state_dtype) that ask for bf16."""
        return [key for key in ("weight_dtype", "state_dtype") if getattr(self, key) == "bf16"]


def margin_problems(head: HeadConfig) -> Iterator[Problem]:
    """head.margin_params must be finite numbers the margin takes."""
    not_finite = [name for name, value in head.margin_params.items() if not math.isfinite(value)]
    if not_finite:  # an infinite margin passed here and failed at step 1 with advice about the lr
        yield "head.margin_params", head.margin_params, f"{not_finite[0]} must be a finite number"
    else:
        try:
            build_margin(head.margin, **head.margin_params)
        except FacetrainError as error:
            yield "head.margin_params", head.margin_params, str(error)


def smoothing_problems(head: HeadConfig) -> Iterator[Problem]:
    """Triton's tiles have no label smoothing (head.kernel auto picks the torch tiles for it)."""
    if head.label_smoothing and head.kernel == "triton":
        yield (
            "head.kernel",
            "triton",
            "has no label smoothing: head.kernel auto or torch, or head.label_smoothing 0",
        )


def storage_problems(head: HeadConfig) -> Iterator[Problem]:
    """bf16 storage needs the tiled head's fused optimizer (it alone rounds updates stochastically);
    sub-centers exist in the untiled head only (head.mode auto then always picks it), the gradient
    filter in the tiled head only."""
    low_precision = head.low_precision_keys()
    if head.gradient_filter and (head.mode == "untiled" or head.sub_centers > 1):
        untiled = head.mode == "untiled"
        key, value = ("head.mode", "untiled") if untiled else ("head.sub_centers", head.sub_centers)
        yield (
            "head.gradient_filter",
            head.gradient_filter,
            f"skips the tiled head's blocks, and {key} {value} means the untiled head: head.mode tiled "
            "(sub_centers 1), or head.gradient_filter 0",
        )
    if head.sub_centers > 1 and (head.mode == "tiled" or low_precision):
        yield (
            "head.sub_centers",
            head.sub_centers,
            "needs the untiled head: head.mode untiled or auto, weight_dtype and state_dtype fp32",
        )
    if low_precision and (head.mode == "untiled" or not head.fused_optimizer):
        yield (
            f"head.{low_precision[0]}",
            "bf16",
            "needs the tiled head's fused optimizer: head.mode tiled or auto, head.fused_optimizer true",
        )
