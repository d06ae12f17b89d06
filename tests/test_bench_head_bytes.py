"""`facetrain bench head`'s memory traffic (issue #56, item 2): the model's arithmetic and structure at tiny
sizes, and the figures the report derives from it and a measured copy bandwidth (no timings asserted)."""

from __future__ import annotations

import math

import pytest

from facetrain.bench.head_bytes import copy_bandwidth, summarize_passes, tiled_passes, traffic_figures

C, D, B = 1000, 64, 32
KINDS = ("weight", "copies", "grad", "logits")


def total(*args) -> int:
    return summarize_passes(tiled_passes(*args))["total"]


def test_triton_fp32_step_under_bf16_moves_what_its_passes_say():
    """The weight read and written once with the momentum by the single-pass update (triton_update.py:
    20 D bytes a class with the gradient), which also writes the bf16 copy of the rows that each logit
    kernel and the dX GEMM read (heads/row_stream.py); the fp32 weight gradient written and read; the
    bf16 logit gradient written once and read by the two GEMMs."""
    parts = summarize_passes(tiled_passes(C, D, B, 4, 2, "triton"))
    assert parts["weight"] == C * D * 4 * 4
    assert parts["copies"] == C * D * (2 + 2 + 2 + 2)
    assert parts["grad"] == C * D * (4 + 4)
    assert parts["logits"] == B * C * 2 * 3
    assert parts["total"] == sum(parts[kind] for kind in KINDS)


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize(("storage", "gemm"), [(4, 4), (4, 2), (2, 2)])
def test_traffic_grows_with_the_classes_alone(kernel, storage, gemm):
    assert total(2 * C, D, B, storage, gemm, kernel) == 2 * total(C, D, B, storage, gemm, kernel)
    passes = tiled_passes(C, D, B, storage, gemm, kernel)
    assert {step.kind for step in passes} <= set(KINDS) and all(step.nbytes > 0 for step in passes)
    assert total(C, D, 2 * B, storage, gemm, kernel) > total(C, D, B, storage, gemm, kernel)


def test_what_the_plans_change():
    assert total(C, D, B, 4, 2, "triton") < total(C, D, B, 4, 2, "torch")  # no B x C logits in the forward
    bf16_weight = summarize_passes(tiled_passes(C, D, B, 2, 2, "triton"))["weight"]
    fp32_weight = summarize_passes(tiled_passes(C, D, B, 4, 2, "triton"))["weight"]
    assert bf16_weight < fp32_weight  # half the bytes of storage, though bf16 updates through fp32 copies


def test_figures_from_bytes_time_and_bandwidth():
    figures = traffic_figures(6 * 10**9, 0.002, 4 * 10**12)
    assert figures["achieved_gbs"] == pytest.approx(3000.0)
    assert figures["bandwidth_fraction"] == pytest.approx(0.75)
    assert figures["floor_ms"] == pytest.approx(1.5)
    assert figures["copy_gbs"] == pytest.approx(4000.0)


def test_copy_bandwidth_is_measured_on_the_device():
    bandwidth = copy_bandwidth("cpu", 4 * 2**20, 2)
    assert math.isfinite(bandwidth) and bandwidth > 1e8
