"""Training data: sources by name, one dataset type, resumable samplers. No torch.distributed here.

The `data` section of a run's config is `facetrain.data.config.DataConfig`, checked against the
sources and samplers registered here.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader

from facetrain.data.config import DataConfig
from facetrain.data.dataset import FaceDataset, KeyedSamples
from facetrain.data.loader_workers import init_loader_worker, worker_context
from facetrain.data.samplers import IdentitySampler, ResumableDistributedSampler
from facetrain.data.sampling import SAMPLERS
from facetrain.data.sources import SOURCES
from facetrain.data.synthetic import generate_synthetic
from facetrain.data.transforms import build_train_transform
from facetrain.logger import logger


def prepare_train_data(cfg: DataConfig) -> None:
    """The one step that writes data before training: the built-in synthetic set, when it is missing.

    Run it once (the trainer runs it on the primary rank before any rank reads the data); every other
    source is read as it is.
    """
    if cfg.source != "synthetic" or (Path(cfg.path) / "train").is_dir():
        return
    logger.info(f"generating the synthetic face set in {cfg.path} (data.synth)")
    generate_synthetic(cfg.path, cfg.synth)


def build_train_dataset(cfg: DataConfig) -> FaceDataset:
    """The training set named by data.source and data.path, decoded and augmented on access."""
    table = SOURCES.build(cfg.source, cfg.path)
    return FaceDataset(table, build_train_transform(cfg.image_size, cfg.augment), cfg.skip_bad_images)


def build_train_loader(
    dataset: FaceDataset,
    cfg: DataConfig,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    accumulation: int = 1,
    with_indices: bool = False,
) -> tuple[DataLoader, ResumableDistributedSampler | IdentitySampler]:
    """A loader of this rank's full batches and its sampler (whose `set_epoch(epoch, consumed)` resumes);
    `accumulation` micro-batches a rank make one optimizer step, and an epoch ends on a whole step.
    `with_indices` adds each sample's dataset index to its batch: (images, labels, indices)."""
    sampler = SAMPLERS.build(
        cfg.sampler, dataset, batch_size, rank, world_size, seed, accumulation, cfg.images_per_identity
    )
    workers = cfg.num_workers
    loader = DataLoader(
        KeyedSamples(dataset) if with_indices else dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        pin_memory=bool(cfg.pin_memory),
        persistent_workers=bool(cfg.persistent_workers) and workers > 0,
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
        worker_init_fn=init_loader_worker if workers > 0 else None,
        multiprocessing_context=worker_context() if workers > 0 else None,
        # its own generator, so making an iterator never draws from the global RNG that a resumed run
        # restores (worker seeds derive from it)
        generator=torch.Generator().manual_seed(seed + 31 * rank),
    )
    return loader, sampler


__all__ = [
    "SAMPLERS",
    "SOURCES",
    "FaceDataset",
    "IdentitySampler",
    "ResumableDistributedSampler",
    "build_train_dataset",
    "prepare_train_data",
    "build_train_loader",
]
