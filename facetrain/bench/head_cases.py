"""The heads `facetrain bench head` compares, and what one rank does to measure one of them.

Each head kind says how to build itself for a configuration, what a training step adds after the
backward (the dense baseline all-reduces its full weight gradient, as DDP would), which optimizer a
full training step runs (`--capacity`), and how much memory each rank needs, so that configurations
that cannot fit are skipped instead of exhausting the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from facetrain.bench.head_bytes import Pass, tiled_passes
from facetrain.errors import FacetrainError
from facetrain.heads import DenseMarginHead, HeadPlan, ShardedMarginHead, class_range, collectives
from facetrain.heads.fused_optim import FusedSGD
from facetrain.heads.gradient_filter import CCE_DEFAULT
from facetrain.heads.kernel_choice import resolve_kernel
from facetrain.heads.margins import build_margin
from facetrain.heads.memory import estimate_head_memory
from facetrain.heads.naive_model_parallel import NaiveModelParallelHead
from facetrain.registry import Registry
from facetrain.train.precision import AUTOCAST_DTYPES, precision_autocast

FLOAT_BYTES = 4


@dataclass(frozen=True)
class HeadCase:
    """One configuration: a head kind, C classes over N ranks, a global batch of B embeddings of D."""

    head: str
    num_classes: int
    world_size: int
    batch: int
    dim: int
    tile_classes: int = 8192
    precision: str = "fp32"  # fp32, or bf16: the step under bf16 autocast, as training runs it
    peers_dir: str = ""  # where the peers' files are (head_peers.py); facetrain's own heads ignore it
    margin: str = "arcface"  # the margin of the kinds that take one (BenchHead.margin None), paper defaults

    def autocast(self, device: torch.device):
        return precision_autocast(device.type, self.precision)

    @property
    def gemm_dtype(self) -> torch.dtype:
        return AUTOCAST_DTYPES[self.precision] or torch.float32

    @property
    def local_batch(self) -> int:
        return self.batch // self.world_size

    def shard_classes(self, rank: int) -> int:
        return class_range(self.num_classes, self.world_size, rank).count


class BenchHead:
    """A head kind as the benchmark sees it; subclasses fill in the three differences."""

    times_gemms = False
    sends_bytes = True  # whether its steps' collectives are counted (bytes_sent)
    # the loss family, for comparing peers with the facetrain heads of the same loss; None: the case's
    # margin (`--margins`), which "{margin}" in `computes` names
    margin: str | None = None
    computes = "{margin}"

    def margin_of(self, case: HeadCase) -> str:
        return self.margin or case.margin

    def describe(self, case: HeadCase) -> str:
        """What this kind computes for `case`, for the report."""
        margin = "ArcFace m 0.5 s 64" if case.margin == "arcface" else f"{case.margin} (its defaults) s 64"
        return self.computes.replace("{margin}", margin)

    def unavailable(self, case: HeadCase, device_kind: str) -> str:
        """Why this kind cannot run `case` on `device_kind` ("" when it can): a row, not a failure."""
        return ""

    def build(self, case: HeadCase) -> nn.Module:
        raise NotImplementedError

    def after_backward(self, head: nn.Module, case: HeadCase) -> None:
        """Work a real training step does between the backward and the optimizer."""

    def optimizer(self, head: nn.Module) -> torch.optim.Optimizer | None:
        """The optimizer of a full training step: torch's SGD with momentum and weight decay, or None
        for a head that updates itself inside the backward."""
        return torch.optim.SGD(head.parameters(), **SGD_SETTINGS)

    def traffic(self, case: HeadCase) -> list[Pass] | None:
        """The passes over C x D and B x C tensors the largest shard's step makes (`head_bytes.py`), or
        None where the benchmark has no model of them."""
        return None

    def estimate_bytes_per_rank(self, case: HeadCase, with_optimizer: bool = False) -> list[int]:
        """Peak growth per rank; with the optimizer, the torch optimizer's momentum is added."""
        momentum = [
            FLOAT_BYTES * rows * case.dim if with_optimizer else 0 for rows in self.weight_rows_per_rank(case)
        ]
        return [step + extra for step, extra in zip(self.estimate_step_bytes(case), momentum)]

    def weight_rows_per_rank(self, case: HeadCase) -> list[int]:
        return [case.shard_classes(rank) for rank in range(case.world_size)]

    def estimate_step_bytes(self, case: HeadCase) -> list[int]:
        raise NotImplementedError


BENCH_HEADS: Registry[BenchHead] = Registry("benchmark head")
SGD_SETTINGS = {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}

# Peaks per rank in units of one fp32 tensor of the named shape, measured with the benchmark itself
# (B=256, D=16 and 512, C=1e5 and 2e5, N=1 and 2). Autograd heads peak either in the weight-gradient
# phase (weight, normalised weight, their gradients: ~6 C x D) or in the logits phase (logits, margin
# logits, log-softmax and their gradients: ~4.5 rows x C), whichever is larger.
WEIGHT_PHASE_COPIES = 6.0
LOGIT_PHASE_COPIES = 4.5
SHARD_LOGIT_PHASE_COPIES = 2.5


def _autograd_peak(weight_rows: int, logit_rows: int, logit_copies: float, case: HeadCase) -> int:
    weight_phase = WEIGHT_PHASE_COPIES * weight_rows * case.dim
    logit_phase = logit_copies * logit_rows + weight_rows * case.dim
    return int(FLOAT_BYTES * max(weight_phase, logit_phase))


@BENCH_HEADS.register("sharded")
class ShardedBench(BenchHead):
    """Weight and gradient of the shard, one B x c buffer, the gathered batch and its gradient."""

    times_gemms = True

    def build(self, case: HeadCase) -> nn.Module:
        return ShardedMarginHead(case.num_classes, case.dim, margin=self.margin_of(case))

    def estimate_step_bytes(self, case: HeadCase) -> list[int]:
        return [
            FLOAT_BYTES * (2 * c * case.dim + case.batch * c + 4 * case.batch * case.dim)
            for c in map(case.shard_classes, range(case.world_size))
        ]


@BENCH_HEADS.register("tiled")
class TiledBench(BenchHead):
    """The tiled head with its fused SGD: weight and momentum, B x T logits at a time, no gradient."""

    times_gemms = True
    storage = torch.float32
    kernel = "torch"
    gradient_filter = 0.0
    computes = "{margin}, its fused SGD update included"

    def build(self, case: HeadCase) -> nn.Module:
        plan = HeadPlan(
            "tiled", case.tile_classes, self.storage, self.storage, fused_optimizer=True, kernel=self.kernel,
            gradient_filter=self.gradient_filter,
        )  # fmt: skip
        head = ShardedMarginHead(case.num_classes, case.dim, margin=self.margin_of(case), plan=plan)
        head.fuse_optimizer(FusedSGD([head.weight], state_dtype=self.storage, **SGD_SETTINGS))
        return head

    def optimizer(self, head: nn.Module) -> torch.optim.Optimizer | None:
        return None

    def traffic(self, case: HeadCase) -> list[Pass] | None:
        storage, gemm = self.storage.itemsize, case.gemm_dtype.itemsize
        return tiled_passes(case.shard_classes(0), case.dim, case.batch, storage, gemm, self.kernel)

    def estimate_bytes_per_rank(self, case: HeadCase, with_optimizer: bool = False) -> list[int]:
        return [
            estimate_head_memory(
                rows, case.dim, case.batch,
                HeadPlan("tiled", case.tile_classes, self.storage, self.storage, fused_optimizer=True,
                         kernel=self.kernel),
                reduced_precision_gemm=case.precision == "bf16",
            ).total
            for rows in self.weight_rows_per_rank(case)
        ]  # fmt: skip


@BENCH_HEADS.register("tiled_filter")
class TiledFilterBench(TiledBench):
    """The tiled head with Cut Cross-Entropy's default gradient filter (`head.gradient_filter` 2^-12)."""

    gradient_filter = CCE_DEFAULT
    computes = "{margin}, gradient blocks below 2^-12 skipped (approximate), its fused SGD update included"


@BENCH_HEADS.register("tiled_bf16")
class TiledBf16Bench(TiledBench):
    """The tiled head with its fused SGD, weight and momentum stored in bf16 (stochastic rounding)."""

    storage = torch.bfloat16
    computes = "{margin}, bf16 weight and momentum, its fused SGD update included"


@BENCH_HEADS.register("sharded_softmax")
class ShardedSoftmaxBench(ShardedBench):
    """The untiled head with no margin (normalised softmax, scale 64): the nearest facetrain computes to
    the plain linear cross-entropy of Liger and Cut Cross-Entropy."""

    margin = "softmax"
    computes = "normalised softmax s 64, no margin"


@BENCH_HEADS.register("tiled_softmax")
class TiledSoftmaxBench(TiledBench):
    """The tiled head with its fused SGD and no margin (normalised softmax, scale 64)."""

    margin = "softmax"
    computes = "normalised softmax s 64, no margin, its fused SGD update included"


@BENCH_HEADS.register("tiled_bf16_softmax")
class TiledBf16SoftmaxBench(TiledBf16Bench):
    """The tiled head with bf16 weight and momentum and no margin."""

    margin = "softmax"
    computes = "normalised softmax s 64, no margin, bf16 weight and momentum, fused SGD included"


@BENCH_HEADS.register("tiled_triton")
class TiledTritonBench(TiledBench):
    """The tiled head with its tiles as Triton kernels (`head.kernel: triton`)."""

    kernel = "triton"
    computes = "{margin}, Triton tiles, its fused SGD update included"

    def unavailable(self, case: HeadCase, device_kind: str) -> str:
        try:
            resolve_kernel("triton", device_kind)
        except FacetrainError as error:
            return str(error)
        return ""


@BENCH_HEADS.register("tiled_triton_fp32_rows")
class TiledTritonFp32RowsBench(TiledTritonBench):
    """The Triton tiles reading the stored fp32 rows in every kernel, without the bf16 copy of them that
    the update keeps under bf16 autocast (`heads/row_stream.py`): that copy's baseline."""

    computes = (
        "{margin}, Triton tiles reading the fp32 rows (no bf16 row copy), its fused SGD update included"
    )

    def build(self, case: HeadCase) -> nn.Module:
        head = super().build(case)
        head.row_stream = None
        return head


@BENCH_HEADS.register("tiled_triton_bf16")
class TiledTritonBf16Bench(TiledTritonBench):
    """The Triton tiles over bf16 weight and momentum."""

    storage = torch.bfloat16
    computes = "{margin}, Triton tiles, bf16 weight and momentum, its fused SGD update included"


@BENCH_HEADS.register("tiled_triton_softmax")
class TiledTritonSoftmaxBench(TiledTritonBench):
    """The Triton tiles with no margin (normalised softmax, scale 64)."""

    margin = "softmax"
    computes = "normalised softmax s 64, no margin, Triton tiles, its fused SGD update included"


@BENCH_HEADS.register("tiled_triton_filter")
class TiledTritonFilterBench(TiledTritonBench):
    """The Triton tiles with the gradient filter at Cut Cross-Entropy's default (2^-12)."""

    gradient_filter = CCE_DEFAULT
    computes = "{margin}, Triton tiles, gradient blocks below 2^-12 skipped (approximate), fused SGD included"


@BENCH_HEADS.register("tiled_triton_softmax_filter")
class TiledTritonSoftmaxFilterBench(TiledTritonSoftmaxBench):
    """No margin, Triton tiles, the gradient filter at 2^-12: what CCE's default row computes, normalised."""

    gradient_filter = CCE_DEFAULT
    computes = (
        "normalised softmax s 64, no margin, Triton tiles, gradient blocks below 2^-12 skipped "
        "(approximate), fused SGD included"
    )


@BENCH_HEADS.register("dense")
class DenseBench(BenchHead):
    """Every rank holds all C classes and the b x C logits of its local rows."""

    def build(self, case: HeadCase) -> nn.Module:
        return DenseMarginHead(case.num_classes, case.dim, margin=self.margin_of(case))

    def after_backward(self, head: nn.Module, case: HeadCase) -> None:
        if case.world_size > 1:
            collectives.all_reduce_(head.weight.grad, "sum").div_(case.world_size)

    def weight_rows_per_rank(self, case: HeadCase) -> list[int]:
        return [case.num_classes] * case.world_size

    def estimate_step_bytes(self, case: HeadCase) -> list[int]:
        logits = case.local_batch * case.num_classes
        return [_autograd_peak(case.num_classes, logits, LOGIT_PHASE_COPIES, case)] * case.world_size


@BENCH_HEADS.register("naive")
class NaiveBench(BenchHead):
    """Shard-sized weights everywhere, but rank 0 also holds the gathered B x C logits and their grads."""

    def unavailable(self, case: HeadCase, device_kind: str) -> str:
        if build_margin(case.margin).of_the_cosine_alone:
            return ""
        return f"the naive baseline computes the classic margins only, not {case.margin}"

    def build(self, case: HeadCase) -> nn.Module:
        return NaiveModelParallelHead(case.num_classes, case.dim, margin=self.margin_of(case))

    def estimate_step_bytes(self, case: HeadCase) -> list[int]:
        estimates = []
        for rank in range(case.world_size):
            shard = case.shard_classes(rank)
            if rank == 0:
                estimates.append(
                    _autograd_peak(shard, case.batch * case.num_classes, LOGIT_PHASE_COPIES, case)
                )
            else:
                logits = case.batch * shard
                estimates.append(_autograd_peak(shard, logits, SHARD_LOGIT_PHASE_COPIES, case))
        return estimates
