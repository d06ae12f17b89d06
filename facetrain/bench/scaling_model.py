"""One training step of the class-sharded head on paper: per-rank memory, compute and bytes on the wire
as functions of C (classes), D (embedding size), b (batch per rank) and N (ranks).

Pure arithmetic (no device), so the cases users ask about (hundreds of GPUs, 100M classes) can be
evaluated anywhere; `facetrain bench scaling` checks it against `facetrain bench head` at N = 1-4 and
docs/scaling.md explains each term. With B = N b the global batch and c = ceil(C / N) a rank's shard:

- wire: the all-gather of the batch (labels, B x D embeddings) and the reduce-scatter of its gradient
  grow with N b D; the softmax statistics are two all-reduces of B floats; nothing depends on C.
- memory: the shard (weight, gradient, optimizer state) grows with C / N; the logits with B x c = b C
  (untiled) or B x T (tiled, T classes a tile); the gathered batch with B x D.
- compute: GEMMs of 2 B c D flops each (three untiled, four tiled: the backward recomputes the
  logits), and elementwise passes over the B x c logits and the c x D rows, memory-bound on a GPU.

Sizes are bytes. Memory is `facetrain.heads.memory.memory_parts`, the one model of what the head's
kernels allocate (fp32 logits and statistics whatever the precision; the embeddings stay fp32: the
backbone's last two layers run in the weights' precision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from facetrain.heads.memory import memory_parts
from facetrain.heads.plan import HeadPlan

FP32, BF16, INT64 = 4, 2, 8
MODES = ("untiled", "tiled")
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class Step:
    """One step's shape. `precision` bf16: GEMMs under bf16 autocast, and for the tiled head the
    weight and momentum stored in bf16 (the untiled head keeps fp32 weights). `backend` nccl
    reduce-scatters the embedding gradient; gloo has no reduce-scatter and all-reduces it."""

    classes: int
    dim: int
    batch_per_rank: int
    world_size: int
    mode: str = "untiled"
    precision: str = "fp32"
    tile_classes: int = 65536
    sample_rate: float = 1.0
    backend: str = "nccl"
    optimizer_states: int = 1  # SGD with momentum; AdamW keeps 2

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_per_rank

    @property
    def shard(self) -> int:
        """Classes of the largest shard (shards differ by at most one class)."""
        return math.ceil(self.classes / self.world_size)

    @property
    def active_classes(self) -> int:
        """Classes a step computes logits for: the shard, or Partial FC's sample of it."""
        return max(min(self.shard, self.global_batch), math.ceil(self.sample_rate * self.shard))

    @property
    def tile(self) -> int:
        return min(self.tile_classes, self.active_classes)

    @property
    def weight_bytes(self) -> int:
        return BF16 if self.precision == "bf16" and self.mode == "tiled" else FP32


def _ring_all_gather(result_bytes: float, n: int) -> float:
    return (n - 1) / n * result_bytes


def _ring_all_reduce(buffer_bytes: float, n: int) -> float:
    return 2 * (n - 1) / n * buffer_bytes


def wire_bytes(step: Step) -> dict[str, float]:
    """Bytes one rank sends per step by collective (ring model, as facetrain.parallel.traffic counts)."""
    n, batch, dim = step.world_size, step.global_batch, step.dim
    gradient = batch * dim * FP32
    return {
        "all_gather_labels": _ring_all_gather(batch * INT64, n),
        "all_gather_embeddings": _ring_all_gather(batch * dim * FP32, n),
        "all_reduce_max": _ring_all_reduce(batch * FP32, n),
        "all_reduce_sum": _ring_all_reduce(3 * batch * FP32, n),
        "embedding_gradient": (
            _ring_all_gather(gradient, n) if step.backend == "nccl" else _ring_all_reduce(gradient, n)
        ),
    }


def memory_bytes(step: Step, with_optimizer_state: bool = True) -> dict[str, float]:
    """One rank's head at the peak of a step, by part (`facetrain.heads.memory.memory_parts`, the model
    the training log and head.mode auto use too). Without `with_optimizer_state` the untiled head has
    no optimizer state (what `facetrain bench head` runs); the tiled head's fused optimizer always
    keeps its own."""
    keeps_state = with_optimizer_state or step.mode == "tiled"
    storage = torch.bfloat16 if step.weight_bytes == BF16 else torch.float32
    plan = HeadPlan(step.mode, step.tile_classes, storage, storage, fused_optimizer=step.mode == "tiled")
    return memory_parts(
        step.shard, step.dim, step.global_batch, plan, active=step.active_classes,
        optimizer_states=step.optimizer_states if keeps_state else 0,
        reduced_precision_gemm=step.precision == "bf16",
    )  # fmt: skip


def gemm_flops(step: Step) -> float:
    """The head's GEMM flops on one rank: logits, embedding gradient and weight gradient, 2 B c D each;
    the tiled backward computes the logits again."""
    gemms = 3 if step.mode == "untiled" else 4
    return gemms * 2 * step.global_batch * step.active_classes * step.dim


# Elementwise passes (bytes read + written, in units of the buffer) of one step, counted from the code:
# untiled logits: scale, row max, subtract + exp, row sum, gradient scale; rows: norm, row-wise dot,
# the projection through the normalisation. Tiled: the online softmax and the logit gradient per tile;
# rows: norm, product, sum, and the fused update (weight, gradient, momentum).
LOGIT_PASSES = {"untiled": 7, "tiled": 6}
ROW_PASSES = {"untiled": 7, "tiled": 10}


def elementwise_bytes(step: Step) -> float:
    logits = LOGIT_PASSES[step.mode] * step.global_batch * step.active_classes * FP32
    rows = ROW_PASSES[step.mode] * step.active_classes * step.dim * FP32
    return logits + rows


@dataclass(frozen=True)
class Device:
    """What a step's time is made of on one kind of device. Rates in flop/s and bytes/s."""

    name: str
    gemm_flops: dict[str, float]  # by precision
    memory_bandwidth: float
    memory_bytes: float = math.inf
    link_bandwidth: float = math.inf  # per rank, within a node
    network_bandwidth: float = math.inf  # per rank, between nodes
    ranks_per_node: int = 8
    latency_s: float = 0.0  # per ring step of a collective


def collective_seconds(step: Step, device: Device) -> float:
    """Bytes over the slowest link the collectives cross, plus latency: N - 1 ring steps for each of
    the two gathers (labels, embeddings) and the gradient's reduce-scatter (NCCL's ring; gloo
    all-reduces the gradient, 2 (N - 1) steps), 2 log2 N for each statistics all-reduce (NCCL's tree
    for small buffers)."""
    n = step.world_size
    if n == 1:
        return 0.0
    bandwidth = device.link_bandwidth if n <= device.ranks_per_node else device.network_bandwidth
    gradient_steps = (1 if step.backend == "nccl" else 2) * (n - 1)
    latency_steps = 2 * (n - 1) + gradient_steps + 2 * 2 * math.ceil(math.log2(n))
    return sum(wire_bytes(step).values()) / bandwidth + latency_steps * device.latency_s


def step_seconds(step: Step, device: Device) -> dict[str, float]:
    """The head's step on one rank, by part: GEMMs, elementwise passes and collectives, assumed not
    to overlap (the statistics all-reduces sit between the forward's passes)."""
    return {
        "gemm": gemm_flops(step) / device.gemm_flops[step.precision],
        "elementwise": elementwise_bytes(step) / device.memory_bandwidth,
        "collectives": collective_seconds(step, device),
    }


@dataclass(frozen=True)
class Backbone:
    """The data-parallel backbone beside the head, for reference: DDP all-reduces its fp32 gradient."""

    name: str
    parameters: int
    train_flops_per_image: float
    activation_bytes_per_image: float
    seconds_per_image: dict[str, float]  # by precision, on the device the cases are evaluated on

    def wire_bytes(self, world_size: int) -> float:
        return _ring_all_reduce(self.parameters * FP32, world_size)

    def memory_bytes(self, batch_per_rank: int, optimizer_states: int = 1) -> float:
        """Weights, gradient, optimizer state and DDP's gradient buckets, fp32, and the activations."""
        return (
            3 + optimizer_states
        ) * self.parameters * FP32 + batch_per_rank * self.activation_bytes_per_image
