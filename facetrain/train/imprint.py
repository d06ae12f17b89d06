"""`head.init: class_means`: a fine-tune's head imprinted from its starting network before the first step.

One pass over the training set, without augmentation and in eval mode, each data-parallel rank
embedding its own share of the photos (every rank-th one); the head's `ClassMeans` gathers them a batch
at a time and writes each class's mean direction into the shard that holds it
(`facetrain.heads.imprint`). The pass draws from none of the run's random streams, so the steps after
it draw what they would draw without it.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from facetrain.data.dataset import FaceDataset
from facetrain.data.loader_workers import init_loader_worker, worker_context
from facetrain.data.transforms import build_eval_transform
from facetrain.heads import collectives
from facetrain.heads.imprint import ClassMeans
from facetrain.heads.sharded import ShardedMarginHead
from facetrain.progress import ProgressBar
from facetrain.train.run_config import Config


def imprint_head(
    cfg: Config, backbone: nn.Module, head: ShardedMarginHead, dataset: FaceDataset, device: torch.device
) -> str:
    """Imprint `head` from `backbone`'s embeddings of `dataset`; the line the run logs about it."""
    started = time.perf_counter()
    plain = FaceDataset(dataset.table, build_eval_transform(cfg.data.image_size), cfg.data.skip_bad_images)
    share = Subset(plain, range(head.rank, len(plain), head.world_size))
    batch = cfg.train.batch_size
    rounds = math.ceil(math.ceil(len(plain) / head.world_size) / batch)  # the largest share's batches
    # its own generator: making the iterator draws a seed, and the run's random streams stay untouched
    workers = cfg.data.num_workers
    loader = iter(
        DataLoader(
            share, batch_size=batch, num_workers=workers, generator=torch.Generator(),
            worker_init_fn=init_loader_worker if workers > 0 else None,  # they end on the run's SIGTERM
            multiprocessing_context=worker_context() if workers > 0 else None,
        )
    )  # fmt: skip
    means = ClassMeans(head)
    was_training = {module: module.training for module in backbone.modules()}
    backbone.eval()
    try:
        with torch.no_grad():
            for _ in ProgressBar(range(rounds), desc="imprint", unit="batch", disable=head.rank != 0):
                images, labels = next(loader, (None, torch.empty(0, dtype=torch.int64)))
                if images is None:  # this rank's share ran out one batch before the largest share's
                    embeddings = torch.empty(0, head.embedding_size, device=device)
                else:
                    layout = torch.channels_last if cfg.model.channels_last else torch.contiguous_format
                    embeddings = backbone(images.to(device, memory_format=layout))
                    if isinstance(embeddings, tuple):  # a re-id backbone's (embedding, features)
                        embeddings = embeddings[0]
                means.add(embeddings, labels, batch)
    finally:
        for module, mode in was_training.items():
            module.training = mode
    classes = torch.tensor(means.write(), device=collectives.collective_device(head.group))
    collectives.all_reduce_(classes, group=head.group)
    return (
        f"head imprinted from {cfg.model.init} (head.init class_means): {int(classes):,} of "
        f"{head.num_classes:,} classes start at their photos' mean embedding ({len(plain):,} photos, "
        f"{time.perf_counter() - started:.0f} s)"
    )
