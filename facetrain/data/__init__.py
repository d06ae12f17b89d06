"""Training data: sources by name, one dataset type, resumable samplers. No torch.distributed here."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader

from facetrain.config import DataConfig
from facetrain.data.dataset import FaceDataset, SampleTable
from facetrain.data.folder import scan_image_folder
from facetrain.data.listfile import scan_list_file
from facetrain.data.loader_workers import init_loader_worker, worker_context
from facetrain.data.market1501 import scan_market1501_train
from facetrain.data.recordio import scan_recordio
from facetrain.data.reid_images import scan_reid_train
from facetrain.data.samplers import IdentitySampler, ResumableDistributedSampler
from facetrain.data.transforms import build_train_transform
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.registry import Registry

SOURCES: Registry[SampleTable] = Registry("data source")


@SOURCES.register("folder")
def _folder(cfg: DataConfig) -> SampleTable:
    return scan_image_folder(cfg.path)


@SOURCES.register("list")
def _list(cfg: DataConfig) -> SampleTable:
    return scan_list_file(cfg.path)


@SOURCES.register("recordio")
def _recordio(cfg: DataConfig) -> SampleTable:
    return scan_recordio(cfg.path)


@SOURCES.register("market1501")
def _market(cfg: DataConfig) -> SampleTable:
    return scan_market1501_train(cfg.path)


@SOURCES.register("reid")
def _reid(cfg: DataConfig) -> SampleTable:
    return scan_reid_train(cfg.path)


@SOURCES.register("synthetic")
def _synthetic(cfg: DataConfig) -> SampleTable:
    train = Path(cfg.path) / "train"
    if not train.is_dir():
        raise FacetrainError(
            f"no synthetic set at {cfg.path}: run `facetrain synth -o {cfg.path}` (facetrain train makes it itself)"
        )
    return scan_image_folder(train)


def prepare_train_data(cfg: DataConfig) -> None:
    """The one step that writes data before training: the built-in synthetic set, when it is missing.

    Run it once (the trainer runs it on the primary rank before any rank reads the data); every other
    source is read as it is.
    """
    if cfg.source != "synthetic" or (Path(cfg.path) / "train").is_dir():
        return
    from facetrain.data.synthetic import generate_synthetic
    from facetrain.progress import ProgressBar  # the line goes to the run's train.log too

    ProgressBar.write(f"generating the synthetic face set in {cfg.path} (data.synth)")
    generate_synthetic(cfg.path, cfg.synth)


def build_train_dataset(cfg: DataConfig) -> FaceDataset:
    """The training set named by data.source and data.path, decoded and augmented on access."""
    table = SOURCES.build(cfg.source, cfg)
    return FaceDataset(table, build_train_transform(cfg.image_size, cfg.augment), cfg.skip_bad_images)


SAMPLERS: Registry[torch.utils.data.Sampler] = Registry("sampler")


@SAMPLERS.register("distributed")
def _distributed(
    dataset, cfg: DataConfig, batch_size: int, rank: int, world_size: int, seed: int, accumulation: int = 1
):
    if len(dataset) // world_size < batch_size:
        raise EveryRankError(no_full_batch(len(dataset), world_size, batch_size))
    step_samples = batch_size * world_size * accumulation
    if len(dataset) < step_samples:
        raise EveryRankError(
            f"the training set gives no full step: {len(dataset)} images, fewer than the {step_samples} of "
            f"one step (train.batch_size {batch_size} x {_ranks(world_size)} x {accumulation} accumulated "
            "micro-batches); lower train.global_batch or optim.grad_accumulation, or add images"
        )
    return ResumableDistributedSampler(
        len(dataset), rank, world_size, seed=seed, batch_size=batch_size, step_samples=step_samples
    )


def no_full_batch(images: int, ranks: int, batch_size: int) -> str:
    """Why a training set of `images` split over `ranks` cannot fill one batch a rank, and the fixes."""
    per_rank = images // ranks
    fixes = [f"set train.batch_size={per_rank} or less"] if per_rank else []
    if ranks > 1 and images >= batch_size:
        fixes.append(f"train on at most {_ranks(images // batch_size)}")
    fixes.append("add images")
    return (
        f"the training set gives no full batch per rank: {images} images over {_ranks(ranks)} is "
        f"{per_rank} a rank, fewer than train.batch_size {batch_size}; " + ", or ".join(fixes)
    )


def _ranks(count: int) -> str:
    return f"{count} rank{'s' if count > 1 else ''}"


@SAMPLERS.register("identity")
def _identity(
    dataset, cfg: DataConfig, batch_size: int, rank: int, world_size: int, seed: int, accumulation: int = 1
):
    step_samples = batch_size * world_size * accumulation
    return IdentitySampler(
        dataset.labels, batch_size, cfg.images_per_identity, rank, world_size, seed, step_samples
    )


def build_train_loader(
    dataset: FaceDataset,
    cfg: DataConfig,
    batch_size: int,
    rank: int,
    world_size: int,
    seed: int,
    accumulation: int = 1,
) -> tuple[DataLoader, ResumableDistributedSampler | IdentitySampler]:
    """A loader of this rank's full batches and its sampler (whose `set_epoch(epoch, consumed)` resumes);
    `accumulation` micro-batches a rank make one optimizer step, and an epoch ends on a whole step."""
    sampler = SAMPLERS.build(cfg.sampler, dataset, cfg, batch_size, rank, world_size, seed, accumulation)
    workers = cfg.num_workers
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=workers,
        pin_memory=cfg.pin_memory,
        persistent_workers=cfg.persistent_workers and workers > 0,
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
