"""Weight imprinting (Qi, Brown and Lowe, CVPR 2018): class rows that start at their photos' mean embedding.

A fine-tune's head drawn at random knows nothing of its classes, so its first steps pull the pretrained
network towards arbitrary directions (or, with `optim.head_only_steps`, spend those steps learning what
the network already says). Started at the direction of each class's mean normalised embedding, the head
is already the nearest-class-mean classifier of the pretrained network, and the fine-tune starts from a
loss that measures what the network gets wrong.

The embeddings are gathered a batch at a time over the head's group, as its forward gathers them, and
each rank adds only the rows of the classes it holds: nothing class-sized crosses ranks, and a shard's
rows equal what one process imprinting every class would write there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from facetrain.heads import collectives
from facetrain.heads.sharded import ShardedMarginHead


class ClassMeans:
    """Running sums of the normalised embeddings of each class this rank's head shard holds."""

    def __init__(self, head: ShardedMarginHead):
        self.head = head
        device = head.weight.device
        self.sums = torch.zeros(head.class_count, head.embedding_size, dtype=torch.float64, device=device)
        self.counts = torch.zeros(head.class_count, dtype=torch.int64, device=device)

    @torch.no_grad()
    def add(self, embeddings: torch.Tensor, labels: torch.Tensor, capacity: int) -> None:
        """A collective over the head's group: every rank calls it as often as the others, each time with
        at most `capacity` rows (zero rows too, for a rank whose photos ran out first)."""
        head = self.head
        device = head.weight.device
        labels = labels.to(device=device, dtype=torch.int64)
        unit = F.normalize(embeddings.to(device=device, dtype=torch.float64), dim=1)
        global_labels = collectives.all_gather_padded(labels, capacity, head.group, pad_value=-1)
        global_unit = collectives.all_gather_padded(unit, capacity, head.group)
        local = global_labels - head.class_start
        owned = (local >= 0) & (local < head.class_count)  # padding's -1 is below every shard
        rows = local[owned]
        self.sums.index_add_(0, rows, global_unit[owned])
        self.counts.index_add_(0, rows, torch.ones_like(rows))

    @torch.no_grad()
    def write(self) -> int:
        """Point each class row that saw a photo (every sub-centre of it) at its class's mean, keeping the
        row's norm, so the head's learning rate acts on it as on the random start; the other rows are
        left as they are. Returns the classes imprinted on this rank."""
        head = self.head
        seen = self.counts > 0
        rows = head.per_class(head.weight).view(head.class_count, head.sub_centers, head.embedding_size)
        norms = torch.linalg.vector_norm(rows[seen].double(), dim=2, keepdim=True)
        direction = F.normalize(self.sums[seen], dim=1).unsqueeze(1)
        rows[seen] = (direction * norms).to(rows.dtype)
        return int(seen.sum())
