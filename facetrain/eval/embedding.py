"""Embedding images for evaluation: batched, without gradients, optionally with the flip test.

The flip test adds the embedding of each image's mirror before normalizing, which removes some
left/right pose bias and is how insightface-style models are usually scored. XNorm, the mean L2
norm of the raw embeddings of the unflipped images, is reported because margin-softmax training
drives it up and a collapse shows there first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from facetrain.data.decode import decode_image
from facetrain.data.transforms import RESIZE_AREA, Transform, build_eval_transform
from facetrain.progress import ProgressBar

ImageInput = np.ndarray | str | Path | bytes


@dataclass(frozen=True)
class Embeddings:
    """Embeddings (N, D) float32, L2-normalized unless asked otherwise, and the XNorm of the raw ones."""

    vectors: np.ndarray
    xnorm: float


class _ImageDataset(Dataset):
    """Decodes (paths or encoded bytes) and preprocesses lazily, so DataLoader workers can share the work."""

    def __init__(self, images: Sequence[ImageInput], transform: Transform, label: str):
        self.images = images
        self.transform = transform
        self.label = label

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> torch.Tensor:
        image = self.images[index]
        if not isinstance(image, np.ndarray):
            image = decode_image(image, name=f"{self.label}[{index}]" if isinstance(image, bytes) else None)
        return self.transform(image)


def compute_embeddings(
    module: nn.Module,
    images: Sequence[ImageInput],
    image_size: tuple[int, int],
    batch_size: int = 128,
    flip: bool = True,
    device: torch.device | str | None = None,
    progress: bool = True,
    num_workers: int = 0,
    label: str = "images",
    interpolation: str = RESIZE_AREA,
    normalized: bool = True,
) -> Embeddings:
    """Embed decoded uint8 RGB arrays, image paths or encoded image bytes with `module`.

    The module runs in eval mode and is put back in its previous mode afterwards, so the trainer can
    call this mid-training. `device` defaults to the device of the module's parameters. Images of
    another size are resized by `interpolation` (`facetrain.data.transforms`: the model card says
    which its model expects). `normalized=False` keeps the (flip-summed) embeddings' norms, which
    IJB's template pooling weighs faces by.
    """
    if len(images) == 0:
        raise ValueError("no images to embed")
    device = torch.device(device) if device is not None else _module_device(module)
    loader = DataLoader(
        _ImageDataset(images, build_eval_transform(image_size, interpolation), label),
        batch_size=batch_size,
        num_workers=num_workers,
    )
    was_training = module.training
    module.eval()
    vectors, norms = [], []
    try:
        with (
            torch.no_grad(),
            ProgressBar(
                total=len(images), desc=f"embedding {label}", unit="img", disable=not progress
            ) as bar,
        ):
            for batch in loader:
                batch = batch.to(device)
                raw = module(batch)
                if raw.ndim != 2:
                    raise ValueError(
                        f"the model must map (B, 3, H, W) to (B, D) embeddings, got shape {tuple(raw.shape)}"
                    )
                norms.append(raw.float().norm(dim=1).cpu())
                combined = raw + module(torch.flip(batch, dims=[3])) if flip else raw
                combined = combined.float()
                vectors.append((nn.functional.normalize(combined, dim=1) if normalized else combined).cpu())
                bar.update(len(batch))
    finally:
        module.train(was_training)
    return Embeddings(torch.cat(vectors).numpy(), float(torch.cat(norms).mean()))


def embed_images(
    module: nn.Module,
    images: Sequence[ImageInput],
    image_size: tuple[int, int],
    batch_size: int = 128,
    flip: bool = True,
    device: torch.device | str | None = None,
    progress: bool = True,
) -> np.ndarray:
    """Just the L2-normalized embeddings (N, D) of `compute_embeddings`."""
    return compute_embeddings(module, images, image_size, batch_size, flip, device, progress).vectors


def _module_device(module: nn.Module) -> torch.device:
    parameter = next(iter(module.parameters()), None)
    return parameter.device if parameter is not None else torch.device("cpu")
