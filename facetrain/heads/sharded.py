"""The class-sharded margin-softmax head: each rank holds 1/N of the class weights.

Every rank sees the whole global batch of embeddings (one all-gather) and computes logits against its
own classes only; the cross-entropy needs just batch-sized statistics from the other ranks. No rank
ever holds logits wider than its shard, and the traffic per step does not depend on the class count.
"""

from __future__ import annotations

import torch
from torch import nn

from facetrain.errors import EveryRankError, FacetrainError
from facetrain.heads.fused_softmax import ShardedMarginSoftmax
from facetrain.heads.margins import Margin, build_margin
from facetrain.heads.partition import class_range
from facetrain.parallel import comm


def check_head_settings(margin: str, scale: float, sample_rate: float, margin_params: dict) -> Margin:
    """The margin for these settings, or a one-line error; cheap, so callers check before heavy work."""
    if scale <= 0:
        raise FacetrainError(f"head scale must be > 0, got {scale} (head.scale)")
    if not 0.0 < sample_rate <= 1.0:
        raise FacetrainError(f"head sample_rate must be in (0, 1], got {sample_rate} (head.sample_rate)")
    return build_margin(margin, **margin_params)


class ShardedMarginHead(nn.Module):
    """ArcFace / CosFace / SphereFace / combined / plain normalised softmax over sharded classes.

    `loss = head(local_embeddings, local_labels)`; the top-1 accuracy of that step is then in
    `head.accuracy`. With `sample_rate < 1` each rank keeps only that fraction of its classes per step
    (Partial FC), always including every class that is a target in the global batch.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: str = "arcface",
        scale: float = 64.0,
        sample_rate: float = 1.0,
        group=None,
        **margin_params: float,
    ):
        super().__init__()
        self.margin = check_head_settings(margin, scale, sample_rate, margin_params)
        if embedding_size < 1:
            raise FacetrainError(f"embedding size must be >= 1, got {embedding_size}")
        self.group = group
        self.world_size = comm.world_size(group)
        self.rank = comm.rank(group)
        if num_classes < self.world_size:
            raise EveryRankError(
                f"{num_classes} classes cannot be sharded over {self.world_size} ranks; use at most "
                f"{num_classes} ranks"
            )
        self.num_classes = num_classes
        self.embedding_size = embedding_size
        self.scale = float(scale)
        self.sample_rate = float(sample_rate)
        self.class_start, self.class_count = class_range(num_classes, self.world_size, self.rank)
        self.weight = nn.Parameter(torch.empty(self.class_count, embedding_size))
        self.reset_parameters()
        self.register_buffer("accuracy", torch.zeros(()), persistent=False)

    def reset_parameters(self, seed: int | None = None, block: int = 4096) -> None:
        """N(0, 0.01) class weights; with a seed, the same full weight whatever the world size.

        Rows are drawn in fixed blocks of classes, each from its own seeded generator, so a rank draws
        only the blocks overlapping its range and a run on N ranks starts where one on M ranks would.
        """
        if seed is None:
            nn.init.normal_(self.weight, std=0.01)
            return
        with torch.no_grad():
            first, last = self.class_start // block, (self.class_stop - 1) // block
            for index in range(first, last + 1):
                generator = torch.Generator().manual_seed(seed * 1_000_003 + index)
                low, high = index * block, min((index + 1) * block, self.num_classes)
                rows = torch.randn(high - low, self.embedding_size, generator=generator) * 0.01
                start, stop = max(low, self.class_start), min(high, self.class_stop)
                self.weight[start - self.class_start : stop - self.class_start] = rows[
                    start - low : stop - low
                ]

    @property
    def class_stop(self) -> int:
        return self.class_start + self.class_count

    def extra_repr(self) -> str:
        return (
            f"classes={self.class_start}:{self.class_stop} of {self.num_classes}, "
            f"embedding_size={self.embedding_size}, margin={self.margin}, scale={self.scale}, "
            f"sample_rate={self.sample_rate}, rank={self.rank}/{self.world_size}"
        )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        counts, global_embeddings, global_labels = self._gather_batch(embeddings, labels)
        owned = (global_labels >= self.class_start) & (global_labels < self.class_stop)
        local_labels = torch.where(owned, global_labels - self.class_start, -1)
        weight, target_column = self.weight, local_labels
        if self.sample_rate < 1.0:
            weight, target_column = self._sample_classes(local_labels)
        loss, hits = ShardedMarginSoftmax.apply(
            global_embeddings, weight, target_column, self.margin, self.scale, self.group
        )
        self.accuracy = hits / sum(counts)
        return loss

    def _gather_batch(self, embeddings: torch.Tensor, labels: torch.Tensor):
        """The global batch, after every rank has checked every rank's inputs (so all fail together)."""
        if embeddings.dim() != 2 or labels.dim() != 1 or labels.shape[0] != embeddings.shape[0]:
            width = embeddings.shape[-1] if embeddings.dim() else 0
            shape = (-1, -1)
        else:
            width = embeddings.shape[1]
            shape = tuple(embeddings.shape)
        sizes = comm.all_gather_equal(
            torch.tensor([[shape[0], width]], dtype=torch.int64, device=embeddings.device), self.group
        ).tolist()
        for rank, (rows, rank_width) in enumerate(sizes):
            if rows < 0:
                raise EveryRankError(
                    f"rank {rank}: head input must be embeddings (B x D) and labels (B); got "
                    f"{tuple(embeddings.shape)} and {tuple(labels.shape)}"
                )
            if rank_width != self.embedding_size:
                raise EveryRankError(
                    f"rank {rank}: embeddings are {rank_width} wide but the head expects "
                    f"{self.embedding_size} (model.embedding_size)"
                )
        counts = [rows for rows, _ in sizes]
        if sum(counts) == 0:
            raise EveryRankError("the global batch is empty: every rank passed zero embeddings")
        labels = labels.to(device=embeddings.device, dtype=torch.int64)
        global_labels = comm.all_gather_rows(labels, counts, self.group)
        bad = (global_labels < 0) | (global_labels >= self.num_classes)
        if bool(bad.any()):
            raise EveryRankError(
                f"label {int(global_labels[bad][0])} is outside [0, {self.num_classes}); "
                "labels must index the head's classes"
            )
        return counts, comm.all_gather_rows(embeddings, counts, self.group), global_labels

    def _sample_classes(self, local_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Partial FC: this step's positives plus random negatives, sample_rate of the shard in all."""
        positives = torch.unique(local_labels[local_labels >= 0])
        keep = max(int(self.sample_rate * self.class_count), positives.numel(), 1)
        if keep >= self.class_count:
            return self.weight, local_labels
        priority = torch.rand(self.class_count, device=self.weight.device)
        priority[positives] = 2.0
        kept = torch.topk(priority, keep, sorted=False).indices.sort().values
        target_column = torch.where(
            local_labels >= 0, torch.searchsorted(kept, local_labels.clamp_min(0)), -1
        )
        return self.weight[kept], target_column
