"""The cases users ask about (8 GPUs x 2M classes, 64 x 10M, 512 x 100M), evaluated with the scaling
model on H100 nodes, and the sweeps behind docs/scaling.md's plots.

The device and backbone figures are this project's H100 measurements where it has them
(docs/benchmarks.md "GPU") and stated assumptions where it has not; docs/scaling.md lists which is which.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from facetrain.bench.scaling_model import (
    FP32,
    Backbone,
    Device,
    Step,
    memory_bytes,
    step_seconds,
    wire_bytes,
)

GIB = 2**30
H100 = Device(
    name="H100 80GB nodes of 8, NVLink within a node, one 400 Gb/s NIC a GPU between nodes",
    # bf16: the head's three GEMMs at C 1M, B 1024, D 512 took 4.5 ms on one H100 (docs/benchmarks.md);
    # fp32 runs as TF32 in training (device_defaults), assumed at half the bf16 rate as the peaks are
    gemm_flops={"bf16": 700e12, "fp32": 350e12},
    # effective rate of the elementwise passes, fitted to the untiled bf16 head at C 1M, B 1024 on one
    # H100 (31.6 ms a step, 4.5 ms of it GEMMs): about half of HBM3's 3.35 TB/s
    memory_bandwidth=1.6e12,
    memory_bytes=80e9,
    link_bandwidth=360e9,  # assumed: NCCL's bus bandwidth over NVLink 4 (450 GB/s a direction)
    network_bandwidth=50e9,  # one 400 Gb/s NIC a GPU, taken as the bound (rails can do better)
    ranks_per_node=8,
    latency_s=5e-6,  # assumed: a ring step of NCCL's LL128 protocol between nodes
)
# iresnet100 at D 512, 112 x 112: parameters and forward flops counted by torch (FlopCounterMode), the
# activations a training forward keeps from facetrain.heads.memory.backbone_training_bytes (fp32, an
# upper bound under bf16). Time per image: r100, bf16, channels_last, batch 256 on one H100 trained
# 3,696 images/s (docs/benchmarks.md); fp32 (TF32) not measured, assumed at half that rate.
R100 = Backbone(
    name="iresnet100",
    parameters=65_123_840,
    train_flops_per_image=3 * 22.445e9,
    activation_bytes_per_image=67.2e6,
    seconds_per_image={"bf16": 1 / 3696, "fp32": 2 / 3696},
)
DIM, BATCH_PER_GPU = 512, 128
USER_CASES = ((8, 2_000_000), (64, 10_000_000), (512, 100_000_000))
TILE_LOGIT_BUDGET = 2 * GIB  # the largest tile (a power of two, at most the CUDA default) whose logits fit
CUDA_TILE = 65536
PARTIAL_FC_RATE = 0.1


def tile_for(global_batch: int) -> int:
    tile = CUDA_TILE
    while tile > 1024 and global_batch * tile * FP32 > TILE_LOGIT_BUDGET:
        tile //= 2
    return tile


def evaluate(step: Step, device: Device = H100, backbone: Backbone = R100) -> dict:
    """Every figure docs/scaling.md tabulates for one step: the head's parts, the backbone's beside them."""
    memory = memory_bytes(step)
    seconds = step_seconds(step, device)
    backbone_memory = backbone.memory_bytes(step.batch_per_rank)
    backbone_s = step.batch_per_rank * backbone.seconds_per_image[step.precision]
    head_s = sum(seconds.values())
    return {
        **asdict(step),
        "shard_classes": step.shard,
        "global_batch": step.global_batch,
        "tile": step.tile,
        "memory_bytes": memory,
        "head_memory_bytes": sum(memory.values()),
        "backbone_memory_bytes": backbone_memory,
        "fits": sum(memory.values()) + backbone_memory <= device.memory_bytes,
        "wire_bytes": wire_bytes(step),
        "head_wire_bytes": sum(wire_bytes(step).values()),
        "backbone_wire_bytes": backbone.wire_bytes(step.world_size),
        "replicated_fc_wire_bytes": 2
        * (step.world_size - 1)
        / step.world_size
        * step.classes
        * step.dim
        * FP32,
        "seconds": seconds,
        "head_s": head_s,
        "backbone_s": backbone_s,
        "head_over_backbone": head_s / backbone_s,
    }


def user_case_steps() -> list[Step]:
    """Each case in fp32 and bf16, untiled and tiled, and with Partial FC where the head outweighs the
    backbone."""
    steps = []
    for gpus, classes in USER_CASES:
        tile = tile_for(gpus * BATCH_PER_GPU)
        for precision in ("fp32", "bf16"):
            for mode in ("untiled", "tiled"):
                steps.append(Step(classes, DIM, BATCH_PER_GPU, gpus, mode, precision, tile))
        if classes >= 10_000_000:
            steps.append(Step(classes, DIM, BATCH_PER_GPU, gpus, "tiled", "bf16", tile, PARTIAL_FC_RATE))
    return steps


def sweep_world_sizes(classes: int, precision: str, mode: str, world_sizes=None) -> list[dict]:
    """One C over growing N (b fixed per GPU), for the plots: what grows with N and what shrinks."""
    sizes = world_sizes or [2**k for k in range(0, 13)]
    return [
        evaluate(Step(classes, DIM, BATCH_PER_GPU, n, mode, precision, tile_for(n * BATCH_PER_GPU)))
        for n in sizes
        if n <= classes
    ]


def sweep_classes(world_size: int, precision: str, sample_rate: float = 1.0) -> list[dict]:
    """The tiled head's step against C at one N: its time per rank grows with b C, not with C / N."""
    tile = tile_for(world_size * BATCH_PER_GPU)
    base = Step(1, DIM, BATCH_PER_GPU, world_size, "tiled", precision, tile, sample_rate)
    return [evaluate(replace(base, classes=int(c))) for c in (1e5, 3e5, 1e6, 3e6, 1e7, 3e7, 1e8, 3e8)]
