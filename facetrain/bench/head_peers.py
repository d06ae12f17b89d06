"""The implementations users would pick instead of facetrain's head, as `facetrain bench head` heads.

Each peer is measured by the same code as facetrain's heads (`head_cases.measure_case`): same B, D, C,
precision and device, in the same worker processes, timed with the same clock (CUDA events on a GPU)
and its peak memory taken the same way. What each computes differs, and the report says so:

- insightface arcface_torch's Partial FC v2 with its ArcFace (`CombinedMarginLoss`, m2 0.5, s 64): the
  same loss as facetrain's ArcFace head at sample rate 1.0 (its margin's gradient is taken as if the
  margin were not there: a straight-through arccos/cos under no_grad); at 0.3, its large-C setting, it
  computes the loss over 30 % of each rank's classes (the batch's own among them), a different loss.
  Under bf16 it runs as insightface trains, its `fp16=True`: the logit GEMM in fp16 autocast.
- Liger-Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy: a plain linear layer and
  softmax cross-entropy, no normalisation, no scale, no margin, on one device. They are the frontier
  for the logit computation itself; facetrain's `sharded_softmax` / `tiled_softmax` heads (normalised
  softmax, no margin) are the closest facetrain computes. Their weight is stored in the step's
  precision (bf16 under bf16), as LLM training hands it to them.

None of their code is in facetrain: `bench/peer_sources.py` loads it from the peers folder.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from facetrain.bench.head_cases import BENCH_HEADS, FLOAT_BYTES, BenchHead, HeadCase
from facetrain.bench.peer_sources import cuda_calls_to, import_wheel, join_one_rank_group, load_insightface

PEERS = {
    "insightface": ("insightface", "insightface_0.3"),
    "liger": ("liger",),
    "cce": ("cce", "cce_exact"),
}
PEER_HEADS = frozenset(head for heads in PEERS.values() for head in heads)


class HeadLoss(NamedTuple):
    loss: torch.Tensor


class _InsightfaceModule(nn.Module):
    def __init__(self, partial_fc: nn.Module):
        super().__init__()
        self.partial_fc = partial_fc

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadLoss:
        # its torch.cuda.amp.autocast is deprecated: a warning every step, about its code, not the figures
        with cuda_calls_to(embeddings.device), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return HeadLoss(self.partial_fc(embeddings, labels.clone()))


@BENCH_HEADS.register("insightface")
class InsightfaceBench(BenchHead):
    """insightface's PartialFC_V2 + CombinedMarginLoss (ArcFace), every class (sample rate 1.0)."""

    sample_rate = 1.0
    margin = "arcface"
    computes = "ArcFace m 0.5 s 64, all classes (insightface Partial FC v2)"

    def build(self, case: HeadCase) -> nn.Module:
        join_one_rank_group(torch.get_default_device())
        partial_fc, losses = load_insightface(Path(case.peers_dir))
        margin = losses.CombinedMarginLoss(64.0, 1.0, 0.5, 0.0)
        fp16 = case.precision != "fp32"
        module = partial_fc.PartialFC_V2(margin, case.dim, case.num_classes, self.sample_rate, fp16=fp16)
        # its weight is made by torch.normal, which the benchmark's device context does not reach
        return _InsightfaceModule(module).to(torch.get_default_device())

    def estimate_step_bytes(self, case: HeadCase) -> list[int]:
        # B x c logits in ~5 copies (fp32 and fp16 logits, clamp, scaled margin logits, one-hot, their
        # gradient) and the weight, its normalised copy and both their gradients
        estimates = []
        for classes in map(case.shard_classes, range(case.world_size)):
            sampled = max(1, int(self.sample_rate * classes))
            estimates.append(
                FLOAT_BYTES * (5 * case.batch * sampled + (2 * classes + 3 * sampled) * case.dim)
            )
        return estimates


@BENCH_HEADS.register("insightface_0.3")
class InsightfaceSampledBench(InsightfaceBench):
    """insightface's Partial FC at sample rate 0.3: 30 % of each rank's classes a step (a different loss)."""

    sample_rate = 0.3
    computes = "ArcFace m 0.5 s 64 over 30 % of the classes (Partial FC 0.3: a different loss)"


class _PlainLinearCE(nn.Module):
    """A weight and a loss function of (weight, embeddings, labels): the interface Liger and CCE share."""

    def __init__(self, weight: torch.Tensor, loss_fn):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.loss_fn = loss_fn

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadLoss:
        return HeadLoss(self.loss_fn(self.weight, embeddings.to(self.weight.dtype), labels))


class _SingleDevicePeer(BenchHead):
    computes = "plain linear + softmax CE: no normalisation, scale or margin; one device"
    margin = "none"
    needs_cuda = True
    sends_bytes = False

    def unavailable(self, case: HeadCase, device_kind: str) -> str:
        if case.world_size > 1:
            return "one device only (no class sharding)"
        if self.needs_cuda and device_kind != "cuda":
            return "its kernels are Triton: CUDA only"
        return ""

    def weight(self, case: HeadCase) -> torch.Tensor:
        dtype = torch.bfloat16 if case.precision == "bf16" else torch.float32
        return (0.01 * torch.randn(case.num_classes, case.dim)).to(dtype)

    def estimate_step_bytes(self, case: HeadCase) -> list[int]:
        # the weight, its gradient (fp32 accumulation), and at most a few B x 32k logit chunks
        return [
            FLOAT_BYTES * (2 * case.num_classes * case.dim + 4 * case.batch * min(case.num_classes, 32768))
        ]


@BENCH_HEADS.register("liger")
class LigerBench(_SingleDevicePeer):
    """Liger-Kernel's LigerFusedLinearCrossEntropyLoss: logits in chunks, gradients made in the forward."""

    def build(self, case: HeadCase) -> nn.Module:
        module = import_wheel(
            Path(case.peers_dir), "liger", "liger_kernel.transformers.fused_linear_cross_entropy"
        )
        return _PlainLinearCE(self.weight(case), module.LigerFusedLinearCrossEntropyLoss())


@BENCH_HEADS.register("cce")
class CutCrossEntropyBench(_SingleDevicePeer):
    """Apple's Cut Cross-Entropy `linear_cross_entropy` as users call it: its Triton kernels on CUDA,
    with its default gradient filter (`filter_eps="high"`: a block of the logit gradient whose entries
    are all below 2^-12 under bf16 is skipped). On the CPU its torch implementation
    (`impl="torch_compile"`, which holds the full logits: CCE's fallback, not CCE)."""

    needs_cuda = False
    filter_eps: str | None = "high"
    computes = (
        "plain linear + softmax CE, no normalisation, scale or margin; one device; gradient blocks below "
        "2^-12 skipped (its default filter: at a near-uniform softmax, almost all)"
    )

    def unavailable(self, case: HeadCase, device_kind: str) -> str:
        if device_kind == "cuda" and case.precision == "fp32":
            return "its Triton backward takes bf16 or fp16 only"
        return super().unavailable(case, device_kind)

    def build(self, case: HeadCase) -> nn.Module:
        module = import_wheel(Path(case.peers_dir), "cce", "cut_cross_entropy")
        cuda = torch.get_default_device().type == "cuda"
        impl, filter_eps = ("cce", self.filter_eps) if cuda else ("torch_compile", None)

        def loss(weight, embeddings, labels):
            if impl == "torch_compile":
                return module.linear_cross_entropy(embeddings, weight, labels, impl=impl)
            return module.linear_cross_entropy(embeddings, weight, labels, impl=impl, filter_eps=filter_eps)

        return _PlainLinearCE(self.weight(case), loss)


@BENCH_HEADS.register("cce_exact")
class CutCrossEntropyExactBench(CutCrossEntropyBench):
    """Cut Cross-Entropy with its gradient filter off (`filter_eps=None`): every gradient entry computed,
    as facetrain's heads compute them. Not on the CPU, where `cce` already runs CCE's unfiltered torch
    implementation."""

    filter_eps = None
    computes = (
        "plain linear + softmax CE, no normalisation, scale or margin; one device; every gradient entry"
    )

    def unavailable(self, case: HeadCase, device_kind: str) -> str:
        if device_kind != "cuda":
            return "on the CPU cce runs CCE's torch implementation, which has no filter: the cce row"
        return super().unavailable(case, device_kind)
