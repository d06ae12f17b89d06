"""The scaling model's arithmetic on a hand-computed step, and `facetrain bench scaling` at a tiny size:
every (N, head) measured by bench head and compared with the model."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from facetrain.bench.scaling_model import (
    Device,
    Step,
    collective_seconds,
    elementwise_bytes,
    gemm_flops,
    memory_bytes,
    wire_bytes,
)
from facetrain.bench.scaling_report import FILES
from facetrain.cli import main
from facetrain.heads.memory import estimate_head_memory
from facetrain.heads.plan import HeadPlan

# C 10 over N 2: shards of 5; b 2 a rank: B 4; D 4
HAND = Step(classes=10, dim=4, batch_per_rank=2, world_size=2)


def test_wire_bytes_by_hand():
    # ring: an all-gather sends (N-1)/N of its result, an all-reduce twice (N-1)/N of its buffer
    assert wire_bytes(HAND) == {
        "all_gather_labels": 1 / 2 * 4 * 8,  # B int64
        "all_gather_embeddings": 1 / 2 * 4 * 4 * 4,  # B x D fp32
        "all_reduce_max": 2 * 1 / 2 * 4 * 4,  # B fp32
        "all_reduce_sum": 2 * 1 / 2 * 3 * 4 * 4,  # 3B fp32
        "embedding_gradient": 1 / 2 * 4 * 4 * 4,  # reduce-scatter of B x D
    }
    gloo = wire_bytes(Step(10, 4, 2, 2, backend="gloo"))
    assert gloo["embedding_gradient"] == 2 * 1 / 2 * 4 * 4 * 4  # gloo all-reduces it


def test_wire_bytes_match_bench_heads_figure():
    """docs/benchmarks.md: the sharded head sends 773.0 KiB at B 256, D 512, N 2 and 1.1 MiB at N 4."""
    assert sum(wire_bytes(Step(100_000, 512, 128, 2, backend="gloo")).values()) == 791_552
    assert sum(wire_bytes(Step(100_000, 512, 64, 4, backend="gloo")).values()) == 1_187_328
    for classes in (10**5, 10**8):  # nothing on the wire depends on C
        assert sum(wire_bytes(Step(classes, 512, 64, 4)).values()) == sum(
            wire_bytes(Step(7, 512, 64, 4)).values()
        )


def test_memory_and_compute_by_hand():
    assert memory_bytes(HAND) == {
        "weight": 5 * 4 * 4,
        "batch": 6 * 4 * 4 * 4,
        "optimizer_state": 5 * 4 * 4,
        "gradient": 5 * 4 * 4,
        "logits": 4 * 5 * 4,  # B x c fp32
        "rows_scratch": 5 * 4 * 4,  # the row-wise dot's block: min(8192, c) x D
    }
    assert memory_bytes(HAND, with_optimizer_state=False)["optimizer_state"] == 0
    tiled = Step(10, 4, 2, 2, mode="tiled", precision="bf16", tile_classes=3)
    assert memory_bytes(tiled, with_optimizer_state=False) == {
        "weight": 5 * 4 * 2,  # bf16 storage
        "batch": 6 * 4 * 4 * 4,
        "optimizer_state": 5 * 4 * 2,  # the fused optimizer's, kept either way
        "gradient": 0,
        "logits": 4 * 3 * (4 + 4 + 2),  # a tile's logits, its gradient and the gradient's bf16 copy
        # per tile row: weight gradient, product, bf16 operand, fp32 working copies of the row and of its
        # momentum, stochastic rounding's int32 noise and bf16 result; one inverse norm a class
        "rows_scratch": 3 * 4 * (4 + 4 + 2 + 4 + 4 + 4 + 2) + 5 * 4,
    }
    assert gemm_flops(HAND) == 3 * 2 * 4 * 5 * 4
    assert gemm_flops(tiled) == 4 * 2 * 4 * 5 * 4
    assert elementwise_bytes(HAND) == 7 * 4 * 5 * 4 + 7 * 5 * 4 * 4
    unit = Device("unit", {"fp32": 1.0}, memory_bandwidth=1.0, link_bandwidth=1.0, latency_s=1.0)
    # 144 bytes at 1 B/s; latency: 1 step each for two gathers and the reduce-scatter, 2 log2 2 for
    # each of the two all-reduces
    assert collective_seconds(HAND, unit) == 144 + 3 + 4


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["untiled", "tiled"])
def test_the_scaling_model_and_the_training_log_count_memory_alike(mode, precision):
    """One model (issue 28 found the training log's tiled estimate 17-47 % above this one): the memory
    `facetrain train` logs and head.mode auto decides by is the scaling model's."""
    step = Step(1_000_000, 512, 128, 8, mode=mode, precision=precision, tile_classes=65536)
    storage = torch.bfloat16 if step.weight_bytes == 2 else torch.float32
    plan = HeadPlan(mode, step.tile_classes, storage, storage, fused_optimizer=mode == "tiled")
    logged = estimate_head_memory(
        step.shard, step.dim, step.global_batch, plan, reduced_precision_gemm=precision == "bf16"
    )
    assert logged.total == sum(memory_bytes(step).values())


def test_partial_fc_keeps_at_least_the_global_batch():
    assert Step(1000, 4, 2, 2, sample_rate=0.1).active_classes == 50  # 0.1 of a 500-class shard
    assert Step(1000, 4, 64, 2, sample_rate=0.1).active_classes == 128  # B 128 positives must fit


def test_validation_at_tiny_size_compares_every_configuration(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "bench", "scaling", "--classes", "20000", "--dim", "64", "--batch-per-rank", "32",
            "--world-sizes", "1,2", "--steps", "1", "--warmup", "1", "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / FILES.names["json"]).read_text())
    rows = report["validation"]["rows"]
    assert [(row["head"], row["world_size"]) for row in rows] == [
        ("sharded", 1), ("tiled", 1), ("sharded", 2), ("tiled", 2)
    ]  # fmt: skip
    for row in rows:
        # bytes are exact after the first step (whose input check adds 4N int64: the warmup); at this
        # size a few MiB the runtime keeps (GEMM packing, allocator) are a large share of the memory, so
        # only the default sizes are held to 10 % (docs/scaling.md); here the model came to -0.43 of the
        # measured peak inside the whole suite on torch 2.14.1 (2026-11-26, twice; it passed alone)
        assert row["relative_error"]["bytes_sent"] == 0
        assert row["measured"]["bytes_sent"] == (0 if row["world_size"] == 1 else row["model"]["bytes_sent"])
        assert row["relative_error"]["peak_memory_bytes"] == pytest.approx(0, abs=0.5)
        assert row["model"]["step_s"] > 0 and row["measured"]["step_s"] > 0
    assert report["validation"]["gemm_flops_per_elementwise_byte"] >= 0
    assert [t["status"] for t in report["targets"]][1] == "PASS"  # bytes
    assert len(report["cases"]) == 14
    for name in ("validation_plot", "world_size_plot", "classes_plot"):
        assert (tmp_path / FILES.names[name]).read_bytes().startswith(b"\x89PNG")
    assert "| sharded | 2 | 64 |" in result.output
