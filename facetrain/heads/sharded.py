"""The class-sharded margin-softmax head: each rank holds 1/N of the class weights.

Every rank sees the whole global batch of embeddings (one all-gather) and computes logits against its
own classes only; the cross-entropy needs just batch-sized statistics from the other ranks. No rank
ever holds logits wider than its shard, and the traffic per step does not depend on the class count.
"""

from __future__ import annotations

import torch
from torch import nn

import facetrain.heads.collectives as collectives
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.heads.base import HeadOutput, MarginHead, regulariser_mean
from facetrain.heads.fused_optim import FusedOptimizer
from facetrain.heads.margin_softmax import NO_SMOOTHING, MarginInput, Smoothing, StepInputs
from facetrain.heads.options import DEFAULT_OPTIONS, HeadOptions, split_options
from facetrain.heads.partition import all_class_ranges, class_range
from facetrain.heads.plan import UNTILED, HeadPlan
from facetrain.heads.row_stream import RowStream, streams_rows
from facetrain.heads.sharded_softmax import ShardedMarginSoftmax
from facetrain.heads.tile_kernel import tile_ops
from facetrain.heads.tiled_softmax import TiledMarginSoftmax, TiledSettings


class ShardedMarginHead(MarginHead):
    """ArcFace / CosFace / SphereFace / combined / plain normalised softmax over sharded classes.

    `loss, accuracy = head(local_embeddings, local_labels)`. With `sample_rate < 1` each rank keeps only
    that fraction of its classes per step (Partial FC), always including every class that is a target in
    the global batch.

    The rarer settings travel as one `HeadOptions` (`options`), or as keywords of their names, which
    the head applies over `options`; the other keywords are the margin's parameters (`m=0.5`).

    The loss is the mean over the global batch, the same on every rank. `gradient_reduction` says how
    the backbone's gradients are combined over the ranks: "mean" (the default) for
    `DistributedDataParallel` and FSDP's `fully_shard` as they come, which average; "sum" for a
    wrapper that adds the ranks' gradients. Either way the backbone ends up with exactly the
    single-process gradient of the global batch.

    The first step checks every rank's inputs (shapes, widths, label range) together, so a bad input
    fails on all ranks at once instead of hanging one of them, and learns the largest row count of any
    rank. Later steps skip the check and its host synchronisation: a rank may pass fewer rows (a last
    batch, uneven data), never more; `check_every_step=True` re-checks every step and lets row counts
    grow as well.

    `plan` (a `HeadPlan`) says how the head computes and stores its classes. Its two modes compute the
    same loss and gradients (docs/head.md): untiled (the fastest: one B x C/N logit buffer) and tiled
    (at most B x `plan.tile_classes` logits at a time). A tiled head can own its optimizer
    (`plan.fused_optimizer`, then `fuse_optimizer`): each tile's rows are updated inside the backward
    and no weight gradient exists, which is what lets the weight live in bf16 (`plan.weight_dtype`).

    `sub_centers` K > 1 (sub-center ArcFace, untiled only) gives each class K weight rows, class-major,
    so a class's centres always share a shard; checkpoints store them as one row of K x D per class.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_size: int,
        margin: str = "arcface",
        scale: float = 64.0,
        sample_rate: float = 1.0,
        group=None,
        plan: HeadPlan = UNTILED,
        options: HeadOptions = DEFAULT_OPTIONS,
        **keywords,
    ):
        options, margin_params = split_options(options, keywords)
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if options.label_smoothing and plan.kernel == "triton":
            raise ValueError("label smoothing runs on the torch tiles: HeadPlan(kernel='torch')")
        if options.sub_centers > 1 and plan.tiled:
            raise ValueError(
                f"sub_centers {options.sub_centers} needs the untiled head: HeadPlan('untiled') or sub_centers=1"
            )
        world_size, rank = collectives.world_size(group), collectives.rank(group)
        if num_classes < world_size:
            raise EveryRankError(
                f"{num_classes} classes cannot be sharded over {world_size} ranks; use at most "
                f"{num_classes} ranks"
            )
        class_start, class_count = class_range(num_classes, world_size, rank)
        rows = class_count * options.sub_centers
        super().__init__(num_classes, embedding_size, rows, margin, scale, plan.weight_dtype, **margin_params)
        self.plan, self.options, self.group = plan, options, group
        self.sub_centers = options.sub_centers
        self.world_size, self.rank = world_size, rank
        self.class_start, self.class_count = class_start, class_count
        self.sample_rate = float(sample_rate)
        self.label_smoothing = float(options.label_smoothing)
        self.check_every_step = options.check_every_step
        self.tile_ops = tile_ops(plan.compile_tiles, plan.kernel)
        self.row_stream = RowStream() if streams_rows(plan) else None  # filled at the first bf16 step
        self.gradient_reduction = options.gradient_reduction
        self._capacity: int | None = None

    def fuse_optimizer(self, optimizer: FusedOptimizer) -> None:
        """Let `optimizer` (a FusedSGD / FusedAdamW over this head's weight) update the weight tile by
        tile inside the backward, as `plan.fused_optimizer` says; the weight then gets no .grad and
        `optimizer.step()` has nothing to do."""
        if not self.plan.fused_optimizer:
            raise ValueError(
                "this head's plan has no fused optimizer: HeadPlan('tiled', ..., fused_optimizer=True)"
            )
        if optimizer.weight is not self.weight:
            raise ValueError(
                "the fused optimizer was built over another tensor than this head's weight: "
                "FusedSGD([head.weight], lr=...)"
            )
        self.fused_optimizer = optimizer

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
                shape = (high - low, self.sub_centers * self.embedding_size)
                rows = torch.randn(shape, generator=generator) * 0.01
                start, stop = max(low, self.class_start), min(high, self.class_stop)
                self.per_class(self.weight)[start - self.class_start : stop - self.class_start] = rows[
                    start - low : stop - low
                ]

    def per_class(self, tensor: torch.Tensor) -> torch.Tensor:
        """A weight-shaped tensor (the weight, its momentum) as one row per class: K x D wide."""
        return tensor.view(self.class_count, -1)

    @property
    def class_stop(self) -> int:
        return self.class_start + self.class_count

    def extra_repr(self) -> str:
        return (
            f"classes={self.class_start}:{self.class_stop} of {self.num_classes}, "
            f"embedding_size={self.embedding_size}, margin={self.margin}, scale={self.scale}, "
            f"sample_rate={self.sample_rate}, sub_centers={self.sub_centers}, "
            f"label_smoothing={self.label_smoothing}, {self.plan}, "
            f"rank={self.rank}/{self.world_size}"
        )

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        if self._capacity is None or self.check_every_step:
            self._capacity = max(self._check_inputs(embeddings, labels))
        elif embeddings.shape[0] > self._capacity:
            raise FacetrainError(
                f"rank {self.rank}: {embeddings.shape[0]} rows, more than any rank's {self._capacity} at the "
                "first step; batches may shrink without notice, but to let them grow build the head with "
                "check_every_step=True"
            )
        labels = labels.to(device=embeddings.device, dtype=torch.int64)
        # Each rank's rows padded to the capacity: padding rows have label -1 and no weight in the loss,
        # so no step needs the other ranks' row counts (no host synchronisation).
        global_labels = collectives.all_gather_padded(labels, self._capacity, self.group, pad_value=-1)
        global_embeddings = collectives.all_gather_padded(
            embeddings, self._capacity, self.group, gradient_averaged=self.gradient_reduction == "mean"
        )
        valid = global_labels >= 0
        owned = (global_labels >= self.class_start) & (global_labels < self.class_stop)
        local_labels = torch.where(owned, global_labels - self.class_start, -1)
        kept, target_column = None, local_labels
        if self.sample_rate < 1.0:
            kept, target_column = self._sample_classes(local_labels)
        if self.plan.fused_optimizer and self.fused_optimizer is None:
            raise ValueError(
                "the head's plan fuses its optimizer: call head.fuse_optimizer(FusedSGD(...)) first"
            )
        margin = MarginInput(self.margin, self.margin_buffers(), self.training)
        smoothing = NO_SMOOTHING
        if self.label_smoothing:
            smoothing = Smoothing(self.label_smoothing, self._softmax_classes(global_labels.shape[0]))
        step = StepInputs(target_column, valid, margin, self.scale, self.group, smoothing)
        if not self.plan.tiled:
            weight = self.weight if kept is None else self.per_class(self.weight)[kept]
            loss, hits = ShardedMarginSoftmax.apply(
                global_embeddings, weight.view(-1, self.embedding_size), step, self.sub_centers
            )
        else:
            settings = TiledSettings(
                kept, self.plan.tile_classes, self.fused_optimizer, self.tile_ops, self.plan.gradient_filter,
                self.row_stream,
            )  # fmt: skip
            loss, hits = TiledMarginSoftmax.apply(global_embeddings, self.weight, step, settings)
        regulariser = self._regulariser(global_embeddings, valid)
        if regulariser is not None:
            loss = loss + regulariser.to(loss.dtype)
        return HeadOutput(loss, hits / valid.sum())

    def _regulariser(self, global_embeddings: torch.Tensor, valid: torch.Tensor) -> torch.Tensor | None:
        """The margin's regulariser of the norms (MagFace), the same value on every rank. Its gradient
        is taken on rank 0 alone: the gathered embeddings' gradients are summed over the ranks."""
        x = global_embeddings if self.rank == 0 else global_embeddings.detach()
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        return regulariser_mean(self.margin, torch.linalg.vector_norm(x.to(wide), dim=1), valid)

    def _check_inputs(self, embeddings: torch.Tensor, labels: torch.Tensor) -> list[int]:
        """Every rank's row count, after every rank has checked every rank's inputs (all fail together)."""
        if embeddings.dim() != 2 or labels.dim() != 1 or labels.shape[0] != embeddings.shape[0]:
            rows, width = -1, embeddings.shape[-1] if embeddings.dim() else 0
        else:
            rows, width = embeddings.shape
        low, high = (int(labels.min()), int(labels.max())) if labels.numel() else (0, 0)
        device = collectives.collective_device(self.group)
        mine = torch.tensor([[rows, width, low, high]], dtype=torch.int64, device=device)
        everyone = collectives.all_gather_equal(mine, self.group).tolist()
        for rank, (rank_rows, rank_width, rank_low, rank_high) in enumerate(everyone):
            if rank_rows < 0:
                raise EveryRankError(
                    f"rank {rank}: head input must be embeddings (B x D) and labels (B); got "
                    f"{tuple(embeddings.shape)} and {tuple(labels.shape)}"
                )
            if rank_width != self.embedding_size:
                raise EveryRankError(
                    f"rank {rank}: embeddings are {rank_width} wide but the head expects "
                    f"{self.embedding_size} (model.embedding_size)"
                )
            if rank_rows and (rank_low < 0 or rank_high >= self.num_classes):
                bad = rank_low if rank_low < 0 else rank_high
                raise EveryRankError(
                    f"label {bad} is outside [0, {self.num_classes}); labels must index the head's classes"
                )
        counts = [rank_rows for rank_rows, *_ in everyone]
        if sum(counts) == 0:
            raise EveryRankError("the global batch is empty: every rank passed zero embeddings")
        return counts

    def _kept_classes(self, class_count: int, rows: int) -> int:
        """How many of a shard's `class_count` classes a step of `rows` global rows keeps (Partial FC)."""
        return min(class_count, max(int(self.sample_rate * class_count), rows, 1))

    def _softmax_classes(self, rows: int) -> int:
        """The number of classes in a step's softmax over every rank: all of them, or what Partial FC keeps
        (known from the shard sizes, so label smoothing's eps / C needs no communication)."""
        if self.sample_rate >= 1.0:
            return self.num_classes
        shards = all_class_ranges(self.num_classes, self.world_size)
        return sum(self._kept_classes(shard.count, rows) for shard in shards)

    def _sample_classes(self, local_labels: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Partial FC: this step's positives plus random negatives, sample_rate of the shard in all.

        Returns the kept rows of the shard (sorted; None when all are kept) and each row's target column
        among them. The number kept is fixed per run, max(sample_rate x shard, global batch) capped at
        the shard, so every positive fits without the step waiting on the host to count them.
        """
        keep = self._kept_classes(self.class_count, local_labels.shape[0])
        if keep >= self.class_count:
            return None, local_labels
        # positives get priority 2 (above any uniform draw); rows owned elsewhere write to a spare slot
        priority = torch.rand(self.class_count + 1, device=self.weight.device)
        slot = torch.where(local_labels >= 0, local_labels, self.class_count)
        priority.index_fill_(0, slot, 2.0)
        kept = torch.topk(priority[:-1], keep, sorted=False).indices.sort().values
        target_column = torch.where(
            local_labels >= 0, torch.searchsorted(kept, local_labels.clamp_min(0)), -1
        )
        return kept, target_column
