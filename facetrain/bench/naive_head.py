"""The classic model-parallel FC, kept as a baseline: shard logits are concatenated on rank 0.

Each rank computes the logits of the global batch against its classes, rank 0 gathers all of them
(B x C) and computes the loss; the backward scatters the logit gradients back. Rank 0's memory and
every rank's traffic grow with the number of classes, which is what the sharded head avoids.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from facetrain.heads.dense import margin_logits
from facetrain.heads.margins import build_margin
from facetrain.heads.partition import class_range
from facetrain.parallel import comm


class NaiveModelParallelHead(nn.Module):
    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: str = "arcface",
        scale: float = 64.0,
        group=None,
        **margin_params: float,
    ):
        super().__init__()
        self.group = group
        self.num_classes = num_classes
        self.embedding_size = embedding_size
        self.margin = build_margin(margin, **margin_params)
        self.scale = float(scale)
        world, rank = comm.world_size(group), comm.rank(group)
        self.class_start, self.class_count = class_range(num_classes, world, rank)
        self.weight = nn.Parameter(torch.empty(self.class_count, embedding_size))
        nn.init.normal_(self.weight, std=0.01)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        counts = comm.gather_row_counts(embeddings.shape[0], embeddings.device, self.group)
        global_embeddings = comm.all_gather_rows(embeddings, counts, self.group)
        global_labels = comm.all_gather_rows(labels.to(torch.int64), counts, self.group)
        cos_shard = F.linear(F.normalize(global_embeddings), F.normalize(self.weight))
        cos_shard = cos_shard.to(torch.promote_types(cos_shard.dtype, torch.float32))
        cos = comm.gather_to_root(cos_shard, self.group)
        if comm.rank(self.group) == 0:
            loss = F.cross_entropy(margin_logits(cos, global_labels, self.margin, self.scale), global_labels)
            value = loss.detach().clone()
        else:
            loss = cos.sum()  # empty, but its backward joins the scatter of the logit gradients
            value = torch.zeros((), device=embeddings.device)
        comm.broadcast_(value, 0, self.group)
        return loss + (value - loss.detach())
