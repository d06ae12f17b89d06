"""`compile_tiles`: the torch.compile'd tile body computes what the eager tiled head and the untiled head
compute (issue #22, item 11).

fp64 to 1e-10 against both, fp32 to 4e-6 of the largest value, with a tile width that leaves a
remainder tile (two compiled shapes), Partial FC's gathered rows and the fused SGD updating inside the
backward; with label smoothing too.
Compilation (Inductor's C++ backend on the CPU) takes a few tens of seconds, hence `slow`.
"""

from __future__ import annotations

import pytest
import torch

from facetrain.heads import ShardedMarginHead
from facetrain.heads.fused_optim import FusedSGD
from tests.support.head_plans import head_plan

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def compiler_works():
    """Skip, saying why, where torch.compile cannot build a CPU kernel here (no C++ compiler, say)."""
    try:
        torch.compile(lambda x: x.exp() + 1, fullgraph=True)(torch.ones(3))
    except Exception as error:  # noqa: BLE001 - any failure to compile means the option cannot run here
        pytest.skip(f"torch.compile unavailable on this CPU: {type(error).__name__}: {error}")


CLASSES, DIM, BATCH, TILE = 50, 16, 12, 16  # tiles of 16, 16, 16 and 2 classes


def problem(dtype):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(CLASSES, DIM, generator=generator, dtype=dtype)
    embeddings = torch.randn(BATCH, DIM, generator=generator, dtype=dtype)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=generator)
    return weight, embeddings, labels


def step(weight, embeddings, labels, tile_classes=None, compile_tiles=False, sample_rate=1.0, fused=False,
         label_smoothing=0.0):  # fmt: skip
    torch.manual_seed(1)  # Partial FC's draw
    head = ShardedMarginHead(
        CLASSES, DIM, sample_rate=sample_rate, label_smoothing=label_smoothing,
        plan=head_plan(tile_classes, fused, weight.dtype, compile_tiles),
    )  # fmt: skip
    with torch.no_grad():
        head.weight.copy_(weight)
    if fused:
        head.fuse_optimizer(FusedSGD([head.weight], lr=0.1, weight_decay=5e-4, state_dtype=weight.dtype))
    x = embeddings.clone().requires_grad_()
    output = head(x, labels)
    output.loss.backward()
    after = head.weight.detach().clone() if fused else head.weight.grad
    return output.loss.detach(), x.grad, after, output.accuracy


def assert_close(actual, expected, dtype):
    # fp32: a few tens of ulps at 1.0. The fused kernels sum each row's exponentials and the GEMMs
    # their products in another order than the eager ops and the untiled head's one wide GEMM.
    tolerance = {torch.float64: 1e-10, torch.float32: 4e-6}[dtype]
    scale = expected.abs().max().clamp_min(1.0)
    assert (actual - expected).abs().max() <= tolerance * scale


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_compiled_tiles_equal_eager_and_untiled(dtype):
    weight, embeddings, labels = problem(dtype)
    untiled = step(weight, embeddings, labels)
    eager = step(weight, embeddings, labels, tile_classes=TILE)
    compiled = step(weight, embeddings, labels, tile_classes=TILE, compile_tiles=True)
    for reference in (untiled, eager):
        for got, expected in zip(compiled, reference):
            assert_close(got, expected, dtype)
    assert compiled[2].abs().sum() > 0  # the weight gradient exists and is not trivially zero


def test_compiled_tiles_with_partial_fc_and_fused_sgd():
    weight, embeddings, labels = problem(torch.float64)
    eager = step(weight, embeddings, labels, TILE, sample_rate=0.5, fused=True)
    compiled = step(weight, embeddings, labels, TILE, compile_tiles=True, sample_rate=0.5, fused=True)
    for got, expected in zip(compiled, eager):
        assert_close(got, expected, torch.float64)
    assert not torch.equal(compiled[2], weight)  # the fused SGD moved the weight


def test_compiled_tiles_with_label_smoothing():
    """The compiled tiles' smoothing (each row's sum of logits, eps / C off every column's gradient)."""
    weight, embeddings, labels = problem(torch.float64)
    untiled = step(weight, embeddings, labels, label_smoothing=0.1)
    compiled = step(weight, embeddings, labels, TILE, compile_tiles=True, label_smoothing=0.1)
    for got, expected in zip(compiled, untiled):
        assert_close(got, expected, torch.float64)
    plain = step(weight, embeddings, labels)
    assert abs(float(compiled[0] - plain[0])) > 1e-3  # the smoothing is in the loss
