"""`head.init: class_means`: a fine-tune's head imprinted from its starting network before the first step.

Each data-parallel rank embeds its own share of the training photos (every rank-th one) with the
evaluation's `compute_embeddings` (no augmentation, eval mode, no flip), so the share's embeddings are
held on the host at once: share x embedding size x 4 bytes (1.3 GB a rank for 5.8 million photos of
512-d over 8 ranks). The head's `ClassMeans` then gathers them a batch at a time and writes each
class's mean direction into the shard that holds it (`facetrain.heads.imprint`). The pass draws from
none of the run's random streams, so the steps after it draw what they would draw without it. It runs
before the loss switches a re-id backbone to returning its features too, so the backbone returns its
embeddings alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch
from torch import nn

from facetrain.data.dataset import EncodedImageReader, FaceDataset
from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.heads import collectives
from facetrain.heads.imprint import ClassMeans
from facetrain.heads.sharded import ShardedMarginHead
from facetrain.train.run_config import Config


class _EncodedShare(Sequence):
    """Every `step`-th encoded image of a reader from `start`, read when embedded."""

    def __init__(self, reader: EncodedImageReader, start: int, step: int):
        self.reader, self.indices = reader, range(start, len(reader), step)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> bytes:
        return self.reader.read(self.indices[position])


def imprint_head(
    cfg: Config, backbone: nn.Module, head: ShardedMarginHead, dataset: FaceDataset, device: torch.device
) -> str:
    """Imprint `head` from `backbone`'s embeddings of `dataset`; the line the run logs about it."""
    started = time.perf_counter()
    share = _EncodedShare(dataset.table.reader, head.rank, head.world_size)
    settings = EmbedSettings(
        tuple(cfg.data.image_size), batch_size=cfg.train.batch_size, flip=False, device=device,
        progress=head.rank == 0, num_workers=cfg.data.num_workers,
    )  # fmt: skip
    embedded = compute_embeddings(
        backbone, share, settings, label="imprint", skip_unreadable=cfg.data.skip_bad_images
    )
    readable = [p for p in range(len(share)) if p not in embedded.unreadable]
    labels = torch.as_tensor(dataset.labels[share.indices][readable])
    embeddings = torch.from_numpy(embedded.vectors).reshape(len(readable), head.embedding_size)
    batch = cfg.train.batch_size
    rounds = math.ceil(math.ceil(len(dataset) / head.world_size) / batch)  # the largest share's batches
    means = ClassMeans(head)
    for first in range(0, rounds * batch, batch):  # a rank whose share ran out passes zero rows
        means.add(embeddings[first : first + batch], labels[first : first + batch], batch)
    classes = torch.tensor(means.write(), device=collectives.collective_device(head.group))
    collectives.all_reduce_(classes, group=head.group)
    return (
        f"head imprinted from {cfg.model.init} (head.init class_means): {int(classes):,} of "
        f"{head.num_classes:,} classes start at their photos' mean embedding ({len(dataset):,} photos, "
        f"{time.perf_counter() - started:.0f} s)"
    )
