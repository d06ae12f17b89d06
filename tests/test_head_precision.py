"""Under bf16 autocast the head's logits are accumulated and written in fp32 (issue #22, item 5).

A bf16 GEMM output keeps 8 significant bits: at scale 64 a target logit near 50 moves by up to 0.125,
and the loss with it. The embeddings here sit near their target rows (target cosines 0.5-0.9, as after
training), where that rounding is largest. With bf16 logits the mean loss of these 16 rows was off by
8e-3 to 3e-2 from fp64 (seeds 0-3, every head mode); with fp32 logits the remaining error is the
operands' bf16 rounding, which the margin and the softmax average: 3e-7 to 2e-6 measured. The bound,
1e-3, sits between the two with a margin of about 8x below the old error and 500x above the new.
"""

from __future__ import annotations

import pytest
import torch

from facetrain.heads import ShardedMarginHead
from facetrain.heads.logit_gemm import LogitGemm
from tests.head_plans import head_plan
from tools.head_precision import make_inputs

CLASSES, DIM, BATCH = 3000, 128, 16
LOSS_BOUND = 1e-3


def near_target_problem(seed):
    """Target cosines 0.5-0.9, where the old bf16 logits' rounding showed most."""
    return make_inputs(CLASSES, BATCH, DIM, seed, lowest=0.5, spread=0.4)


def head_loss(weight, embeddings, labels, dtype, tile_classes, autocast):
    head = ShardedMarginHead(CLASSES, DIM, plan=head_plan(tile_classes, dtype=dtype))
    with torch.no_grad():
        head.weight.copy_(weight)
    x = embeddings.to(torch.float64 if dtype == torch.float64 else torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        return head(x, labels).loss.item()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "tile_classes,dtype", [(None, torch.float32), (512, torch.float32), (512, torch.bfloat16)]
)
def test_bf16_autocast_loss_is_within_bound_of_fp64(seed, tile_classes, dtype):
    weight, embeddings, labels = near_target_problem(seed)
    reference = head_loss(weight, embeddings, labels, torch.float64, None, autocast=False)
    loss = head_loss(weight, embeddings, labels, dtype, tile_classes, autocast=True)
    assert abs(loss - reference) < LOSS_BOUND


def test_logit_gemm_writes_fp32_from_bf16_operands():
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(64, 256, generator=generator).to(torch.bfloat16)
    b = torch.randn(256, 300, generator=generator).to(torch.bfloat16)
    exact = a.double() @ b.double()
    gemm = LogitGemm(torch.device("cpu"), torch.bfloat16, torch.float32)
    product = gemm.mm(a, b)
    assert product.dtype == torch.float32
    # fp32 accumulation of exact bf16 products: ~1e-6 of the row's magnitude, against bf16's 2^-9
    bf16_error = (torch.mm(a, b).double() - exact).abs().max()
    assert (product.double() - exact).abs().max() < bf16_error / 100


@pytest.mark.parametrize("backbone", ["r18", "iresnet18"])
def test_embedding_layer_runs_in_fp32_under_autocast(backbone):
    """r18-r100 share FlattenedEmbedding: its FC and final BN, which set the embedding's scale, stay in
    fp32 under bf16 autocast (as IResNet's do), so the head gets fp32 embeddings."""
    from facetrain.models.registry import BACKBONES

    torch.manual_seed(0)
    model = BACKBONES.build(backbone, embedding_size=32, dropout=0.0, input_size=(32, 32)).eval()
    images = torch.randn(2, 3, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = model(images)
    assert embeddings.dtype == torch.float32
    with torch.no_grad():
        reference = model(images)
    # the convolutions ran in bf16, the embedding layer did not round its output to bf16
    assert not torch.equal(embeddings.to(torch.bfloat16).float(), embeddings)
    assert (embeddings - reference).norm() <= 0.05 * reference.norm()
