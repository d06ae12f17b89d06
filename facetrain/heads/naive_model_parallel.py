"""The classic model-parallel FC, the baseline the benchmarks and tests/test_head.py measure the sharded
head against: shard logits are concatenated on rank 0. Training never builds it (no registry names it).

Each rank computes the logits of the global batch against its classes, rank 0 gathers all of them
(B x C) and computes the loss; the backward scatters the logit gradients back. Rank 0's memory and
every rank's traffic grow with the number of classes, which is what the sharded head avoids. Its
collectives live here, with it: facetrain's training code never gathers logits.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from facetrain.heads import collectives
from facetrain.heads.base import HeadOutput, MarginHead
from facetrain.heads.dense import margin_logits
from facetrain.heads.partition import class_range


class NaiveModelParallelHead(MarginHead):
    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: str = "arcface",
        scale: float = 64.0,
        group=None,
        **margin_params: float,
    ):
        self_range = class_range(num_classes, collectives.world_size(group), collectives.rank(group))
        super().__init__(num_classes, embedding_size, self_range.count, margin, scale, **margin_params)
        if not self.margin.of_the_cosine_alone:
            raise ValueError(f"the naive model-parallel FC computes the classic margins only, not {margin!r}")
        self.group = group
        self.class_start, self.class_count = self_range

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        counts = _row_counts(embeddings.shape[0], embeddings.device, self.group)
        global_embeddings = collectives.all_gather_rows(embeddings, counts, self.group)
        global_labels = collectives.all_gather_rows(labels.to(torch.int64), counts, self.group)
        cos_shard = F.linear(F.normalize(global_embeddings), F.normalize(self.weight))
        cos_shard = cos_shard.to(torch.promote_types(cos_shard.dtype, torch.float32))
        cos = gather_columns_to_root(cos_shard, self.group)
        figures = torch.zeros(2, device=embeddings.device)
        if collectives.rank(self.group) == 0:
            loss = F.cross_entropy(margin_logits(cos, global_labels, self.margin, self.scale), global_labels)
            figures[0] = loss.detach()
            figures[1] = (cos.argmax(dim=1) == global_labels).float().mean()
        else:
            loss = cos.sum()  # empty, but its backward joins the scatter of the logit gradients
        collectives.broadcast_(figures, 0, self.group)
        return HeadOutput(loss + (figures[0] - loss.detach()), figures[1])


def _row_counts(rows: int, device: torch.device, group) -> list[int]:
    """The number of rows each rank contributes, so that unequal local batches still line up."""
    if not collectives.is_active(group):
        return [rows]
    return collectives.all_gather_equal(
        torch.tensor([rows], dtype=torch.int64, device=device), group
    ).tolist()


def gather_columns_to_root(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 1 on rank 0.

    Rank 0 gets the full result; other ranks get an empty tensor that still carries the graph, so
    their backward joins the scatter that returns each rank its slice of the gradient.
    """
    if not collectives.is_active(group):
        return tensor
    return _GatherColumnsToRoot.apply(tensor, group)


class _GatherColumnsToRoot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group):
        n, me = collectives.world_size(group), collectives.rank(group)
        widths = [
            int(w)
            for w in collectives.all_gather_equal(
                torch.tensor([tensor.shape[1]], device=tensor.device), group
            )
        ]
        ctx.group, ctx.widths = group, widths
        width = max(widths)
        padded = tensor.new_zeros((tensor.shape[0], width))
        padded[:, : tensor.shape[1]] = tensor
        root = dist.get_global_rank(group, 0) if group is not None else 0
        if me == 0:
            parts = [torch.empty_like(padded) for _ in range(n)]
            dist.gather(padded.contiguous(), parts, dst=root, group=group)
            return torch.cat([p[:, :w] for p, w in zip(parts, widths)], dim=1)
        dist.gather(padded.contiguous(), None, dst=root, group=group)
        return tensor.new_empty((tensor.shape[0], 0))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        group, widths = ctx.group, ctx.widths
        me, width = collectives.rank(group), max(widths)
        root = dist.get_global_rank(group, 0) if group is not None else 0
        mine = grad.new_empty((grad.shape[0], width))
        if me == 0:
            pieces = torch.split(grad, widths, dim=1)
            parts = [grad.new_zeros((grad.shape[0], width)) for _ in widths]
            for part, piece in zip(parts, pieces):
                part[:, : piece.shape[1]] = piece
            dist.scatter(mine, parts, src=root, group=group)
        else:
            dist.scatter(mine, None, src=root, group=group)
        return mine[:, : widths[me]], None
