"""Where the untiled head's GEMMs take bf16 class rows that they write fp32 from (CUDA under bf16
autocast), the pass that casts the rows also scales them by scale / |w| (`sharded_softmax._scaled_rows`),
so neither the logits nor their gradient take a pass for that factor (issue #40, item 3).

The CPU has no bf16 GEMM with an fp32 output, so these tests give torch.mm CUDA's behaviour (products
of the bf16 operands accumulated and written wide) to run that path here; `pytest -m cuda` runs it on a
GPU against the dense reference as well.
"""

from __future__ import annotations

import pytest
import torch

import facetrain.heads.logit_gemm as logit_gemm
import facetrain.heads.sharded_softmax as sharded_softmax
from facetrain.heads import DenseMarginHead, ShardedMarginHead

CLASSES, DIM, BATCH = 300, 32, 24


@pytest.fixture
def cuda_like_gemm(monkeypatch):
    """torch.mm(..., out_dtype=fp32) from bf16 operands, as CUDA has it; counts the folded casts."""
    plain_mm = torch.mm

    def mm(a, b, *, out_dtype=None, out=None):
        if out_dtype is None:
            return plain_mm(a, b) if out is None else plain_mm(a, b, out=out)
        product = plain_mm(a.double(), b.double()).to(out_dtype)
        return product if out is None else out.copy_(product)

    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(logit_gemm, "_has_out_dtype_mm", lambda device_type: True)
    folded = []
    scaled_rows = sharded_softmax._scaled_rows
    monkeypatch.setattr(
        sharded_softmax, "_scaled_rows", lambda *args: folded.append(args[-1]) or scaled_rows(*args)
    )
    return folded


def _step(head, weight, embeddings, labels, autocast):
    with torch.no_grad():
        head.weight.copy_(weight)
    x = embeddings.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = head(x, labels).loss
    loss.backward()
    return loss.item(), x.grad.double(), head.weight.grad.double()


@pytest.mark.parametrize("margin", ["arcface", "cosface", "sphereface"])
def test_folded_rows_give_the_dense_loss_and_gradients_to_bf16_operand_rounding(cuda_like_gemm, margin):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(CLASSES, DIM, generator=generator)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=generator)
    # near their class: a loss of a few nats, so every gradient term matters
    embeddings = weight[labels] + 0.5 * torch.randn(BATCH, DIM, generator=generator)
    loss, grad_x, grad_w = _step(
        ShardedMarginHead(CLASSES, DIM, margin=margin), weight, embeddings, labels, True
    )
    assert cuda_like_gemm == [torch.bfloat16, torch.bfloat16]  # forward and backward took the folded rows
    dense = DenseMarginHead(CLASSES, DIM, margin=margin).double()
    exact_loss, exact_x, exact_w = _step(dense, weight.double(), embeddings.double(), labels, False)
    # bf16 operands (2^-9 relative each): measured here 0.3-0.9 % on the loss and 1.1-1.7 % on the
    # gradients for the folded rows, and the same ranges with the rows cast plainly (the former path)
    assert loss == pytest.approx(exact_loss, rel=1e-2)
    for grad, exact in ((grad_x, exact_x), (grad_w, exact_w)):
        assert (grad - exact).norm() / exact.norm() < 3e-2
