"""Small head problems and the dense reference the head tests share, and the registered margins split
by what each reads, so a margin test runs over `MARGINS` (as timm's test_models.py over its registry):
a new margin is tested by registering it (no tests here)."""

from __future__ import annotations

import torch

from facetrain.heads import DenseMarginHead, all_class_ranges
from facetrain.heads.margins import MARGINS, build_margin

# one name per margin: an alias (am_softmax is cosface) is the same margin
DISTINCT_MARGINS = MARGINS.canonical_names()
# the classic margins: a function of the target cosine alone
COSINE_MARGINS = [name for name in DISTINCT_MARGINS if build_margin(name).of_the_cosine_alone]
# the quality-aware and curriculum margins: they read the batch's norms and rows, keep running state or
# modulate the negatives (`facetrain.heads.margins.base`)
ROW_MARGINS = [name for name in DISTINCT_MARGINS if not build_margin(name).of_the_cosine_alone]

LABEL_PATTERNS = ["spread", "one_rank"]
NUM_CLASSES, EMBEDDING, BATCH = 23, 12, 10


def make_problem(pattern: str, dtype: torch.dtype, num_classes=NUM_CLASSES, batch=BATCH, world_size=2):
    generator = torch.Generator().manual_seed(LABEL_PATTERNS.index(pattern))
    weight = torch.randn(num_classes, EMBEDDING, generator=generator, dtype=dtype) * 0.05
    embeddings = torch.randn(batch, EMBEDDING, generator=generator, dtype=dtype) * 3.0
    if pattern == "spread":
        labels = torch.randint(0, num_classes, (batch,), generator=generator)
    else:  # every target on the last rank's shard
        last = all_class_ranges(num_classes, world_size)[-1]
        labels = torch.randint(last.start, last.stop, (batch,), generator=generator)
    return weight, embeddings, labels


def dense_reference(margin, weight, embeddings, labels):
    head = DenseMarginHead(weight.shape[0], weight.shape[1], margin=margin).to(weight.dtype)
    head.weight.data.copy_(weight)
    x = embeddings.clone().requires_grad_()
    loss, accuracy = head(x, labels)
    loss.backward()
    return loss.detach(), x.grad, head.weight.grad, accuracy


def local_rows(world_size: int, rank: int, batch: int) -> slice:
    bounds = [round(r * batch / world_size) for r in range(world_size + 1)]
    return slice(bounds[rank], bounds[rank + 1])


def assert_matches(actual, expected, dtype):
    """fp64 agrees to 1e-10; fp32 to 1e-5 of the quantity's magnitude (weight gradients reach ~1e2)."""
    tolerance = 1e-10 if dtype == torch.float64 else 1e-5
    scale = max(1.0, float(expected.abs().max()))
    assert float((actual - expected).abs().max()) <= tolerance * scale
