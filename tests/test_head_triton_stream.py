"""The Triton tiles' bf16 row copy (`heads/row_stream.py`, issue #56 item 1): under bf16 autocast a tiled
head with fp32 rows and fused SGD keeps a bf16 copy of its rows, written by the update kernel, and its
logit kernels read that copy instead of the fp32 rows.

On the CPU through Triton's interpreter (tests/conftest.py), compiled on a GPU under `pytest -m cuda`.
Exact in the sense that the GEMM operands are the torch tiles': after every step the copy equals the
weight cast to bf16 bit for bit, it was made once (the update kernel kept it in step), and two steps
with it equal two steps of the same kernels reading the fp32 rows (which test_head_triton.py holds to
the torch tiles) to 1e-5, for every margin and Partial FC's gathered rows. bf16 storage, AdamW and fp32
GEMMs take no copy. Shapes are test_head_triton.py's: 19 rows, 50 classes in tiles of 20, D 12.
"""

from __future__ import annotations

import pytest
import torch

import facetrain.heads.sharded as sharded
from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.heads.fused_optim import FusedAdamW, FusedSGD
from facetrain.heads.memory import describe, estimate_head_memory, memory_parts
from tests.support.head_problems import DISTINCT_MARGINS, make_problem
from tests.support.triton_cases import DEVICES, EXACT, relative_error

pytest.importorskip("triton")

CLASSES, BATCH, TILE = 50, 19, 20


@pytest.fixture(params=DEVICES)
def device(request):
    import facetrain.heads.triton_tile as kernels

    if request.param == "cpu" and not kernels.INTERPRETED:
        pytest.skip("Triton was compiled for the GPU in this process; the CPU cases need its interpreter")
    return torch.device(request.param)


def tiled_head(device, weight, margin="arcface", sample_rate=1.0, storage=torch.float32, optimizer=FusedSGD):
    plan = HeadPlan("tiled", TILE, storage, storage, fused_optimizer=True, kernel="triton")
    head = ShardedMarginHead(
        weight.shape[0], weight.shape[1], margin=margin, sample_rate=sample_rate, plan=plan,
        gradient_reduction="sum",
    ).to(device)  # fmt: skip
    with torch.no_grad():
        head.weight.copy_(weight)
    head.fuse_optimizer(optimizer([head.weight], lr=0.1, weight_decay=5e-4, state_dtype=storage))
    return head


def bf16_steps(head, embeddings, labels, steps=2):
    """`steps` steps under bf16 autocast: the losses, the last dX, the weight and the optimizer's state."""
    device, losses = head.weight.device, []
    torch.manual_seed(1)  # Partial FC's draws, alike with and without the copy
    for _ in range(steps):
        x = embeddings.to(device).requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = head(x, labels.to(device)).loss
        loss.backward()
        losses.append(loss.detach())
    state = [value for value in head.fused_optimizer.state[head.weight].values() if value.dim()]
    return [torch.stack(losses), x.grad, head.weight.detach(), *state]


def assert_copy_of(head):
    """The copy holds the weight rounded to bf16 as torch rounds it, and the fp32 rows' inverse norms."""
    stream = head.row_stream
    assert torch.equal(stream.rows, head.weight.detach().to(torch.bfloat16))
    inv_norms = torch.linalg.vector_norm(head.weight.detach(), dim=1).reciprocal()
    assert relative_error(stream.inv_norms, inv_norms) <= 1e-6


@pytest.mark.parametrize(
    ("margin", "sample_rate"),
    [(name, 1.0) for name in DISTINCT_MARGINS] + [("cosface", 0.5), ("adaface", 0.5)],
)
def test_the_copy_equals_reading_the_fp32_rows(device, margin, sample_rate, monkeypatch):
    weight, embeddings, labels = make_problem("spread", torch.float32, CLASSES, BATCH)
    head = tiled_head(device, weight, margin, sample_rate)
    copies = []
    refresh = type(head.row_stream).refresh
    monkeypatch.setattr(
        type(head.row_stream),
        "refresh",
        lambda stream, w: copies.append(stream._copied_from) or refresh(stream, w),
    )
    streamed = bf16_steps(head, embeddings, labels)
    assert_copy_of(head)
    assert copies[0] is None and copies[1:] == [head.row_stream._copied_from]  # made once, then kept
    monkeypatch.setattr(sharded, "streams_rows", lambda plan: False)
    fp32_rows = tiled_head(device, weight, margin, sample_rate)
    assert fp32_rows.row_stream is None
    for got, expected in zip(streamed, bf16_steps(fp32_rows, embeddings, labels), strict=True):
        assert relative_error(got, expected) <= EXACT


def test_the_copy_is_made_again_when_torch_writes_the_weight(device):
    """A write the update kernel did not make (a checkpoint load, imprinting) moves the weight's version
    counter: the next step copies the rows again before its kernels read them."""
    weight, embeddings, labels = make_problem("spread", torch.float32, CLASSES, BATCH)
    head = tiled_head(device, weight)
    bf16_steps(head, embeddings, labels, steps=1)
    with torch.no_grad():
        head.weight.mul_(-0.5)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16):
        head(embeddings.to(device), labels.to(device))
    assert_copy_of(head)


@pytest.mark.parametrize("case", ["bf16 storage", "adamw", "fp32 gemm"])
def test_no_copy_where_the_kernels_read_what_they_need(device, case):
    """bf16 storage is read as it is, AdamW's update is torch's (it could not keep a copy in step) and fp32
    GEMMs read fp32 rows: none of them makes or holds a copy."""
    weight, embeddings, labels = make_problem("spread", torch.float32, CLASSES, BATCH)
    storage = torch.bfloat16 if case == "bf16 storage" else torch.float32
    head = tiled_head(device, weight, storage=storage, optimizer=FusedAdamW if case == "adamw" else FusedSGD)
    if case == "fp32 gemm":
        head(embeddings.to(device), labels.to(device)).loss.backward()
    else:
        bf16_steps(head, embeddings, labels, steps=1)
    assert head.row_stream is None if case == "bf16 storage" else head.row_stream.rows is None


def test_the_memory_model_counts_the_copy():
    """2 D + 4 bytes a class, in what lives through training, where a step would keep it."""
    rows, dim, batch = 1000, 512, 256
    triton = HeadPlan("tiled", 128, fused_optimizer=True, kernel="triton")
    parts = memory_parts(rows, dim, batch, triton, reduced_precision_gemm=True)
    assert parts["row_stream"] == rows * (2 * dim + 4)
    assert "row_stream" not in memory_parts(rows, dim, batch, triton)  # fp32 GEMMs read the rows
    assert "row_stream" not in memory_parts(
        rows, dim, batch, triton, optimizer_states=2, reduced_precision_gemm=True
    )
    torch_tiles = HeadPlan("tiled", 128, fused_optimizer=True)
    assert "row_stream" not in memory_parts(rows, dim, batch, torch_tiles, reduced_precision_gemm=True)
    memory = estimate_head_memory(rows, dim, batch, triton, reduced_precision_gemm=True)
    without = estimate_head_memory(rows, dim, batch, triton)
    assert memory.persistent - without.persistent == rows * (2 * dim + 4)
    assert "bf16 row copy 0.98 MiB" in describe(memory)
