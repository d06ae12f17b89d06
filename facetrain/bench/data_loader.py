"""The loader part of `facetrain bench data`: images/s that N DataLoader workers deliver onto the device.

The single-worker figures of `bench/data.py` say what one core decodes; this says whether N workers
keep a training device fed: the trainer's own `build_train_loader` (pinned memory on CUDA, so that the
non_blocking copy overlaps), every batch copied to the device as the step does, timed over whole
epochs after a first one that starts the workers and fills the page cache.
"""

from __future__ import annotations

import statistics
import time

import torch

from facetrain.data import build_train_loader
from facetrain.data.config import DataConfig
from facetrain.data.dataset import FaceDataset


def loader_images_per_second(
    dataset: FaceDataset, workers: int, batch_size: int, epochs: int, device: torch.device
) -> dict:
    cfg = DataConfig(num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0)
    loader, sampler = build_train_loader(dataset, cfg, batch_size, rank=0, world_size=1, seed=0)
    rates = []
    for epoch in range(epochs + 1):
        sampler.set_epoch(epoch, 0)
        images = 0
        started = time.perf_counter()
        for batch, _ in loader:
            images += batch.to(device, non_blocking=True).shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if epoch > 0:  # the first epoch starts the workers
            rates.append(images / (time.perf_counter() - started))
    return {
        "workers": workers,
        "batch_size": batch_size,
        "pin_memory": cfg.pin_memory,
        "images_per_epoch": len(loader) * batch_size,
        "images_per_s": statistics.median(rates),
        "per_epoch": rates,
    }
