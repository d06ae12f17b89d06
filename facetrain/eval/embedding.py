"""Embedding images for evaluation: batched, without gradients, optionally with the flip test.

The flip test adds the embedding of each image's mirror before normalizing, which removes some
left/right pose bias and is how insightface-style models are usually scored. XNorm, the mean L2
norm of the raw embeddings of the unflipped images, is reported because margin-softmax training
drives it up and a collapse shows there first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from facetrain.data.decode import BadImageError, decode_image
from facetrain.data.loader_workers import init_loader_worker, worker_context
from facetrain.data.transforms import RESIZE_AREA, Transform, build_eval_transform
from facetrain.progress import ProgressBar

ImageInput = np.ndarray | str | Path | bytes


@dataclass(frozen=True)
class EmbedSettings:
    """How an evaluation embeds its images: the model's input (`image_size`, the `interpolation` its
    card names) and how to run it. Every evaluation takes this one object, so a new setting is one
    field here rather than a parameter on each of them."""

    image_size: tuple[int, int]
    batch_size: int = 128
    flip: bool = True
    device: torch.device | str | None = None
    progress: bool = True
    num_workers: int = 0
    interpolation: str = RESIZE_AREA


@dataclass(frozen=True)
class Embeddings:
    """Embeddings (N, D) float32, L2-normalized unless asked otherwise, and the XNorm of the raw ones;
    with `skip_unreadable`, `unreadable` maps the position of each image left out to why, and `vectors`
    holds the others' rows."""

    vectors: np.ndarray
    xnorm: float
    unreadable: dict[int, str] = field(default_factory=dict)
    # each row's raw embedding norm (of the image itself, not flip-summed): a quality score where the
    # head's margin made it one (MagFace, AdaFace)
    norms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))


class _ImageDataset(Dataset):
    """Decodes (paths or encoded bytes) and preprocesses lazily, so DataLoader workers can share the work."""

    def __init__(self, images: Sequence[ImageInput], transform: Transform, label: str, skip_unreadable: bool):
        self.images = images
        self.transform = transform
        self.label = label
        self.skip_unreadable = skip_unreadable

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | str]:
        """The image's position and its tensor, or (skip_unreadable) why it cannot be read."""
        image = self.images[index]
        if not isinstance(image, np.ndarray):
            try:
                image = decode_image(
                    image, name=f"{self.label}[{index}]" if isinstance(image, bytes) else None
                )
            except BadImageError as error:
                if not self.skip_unreadable:
                    raise
                return index, str(error)
        return index, self.transform(image)


def _collate(items: list[tuple[int, torch.Tensor | str]]) -> tuple[torch.Tensor | None, dict[int, str]]:
    """The batch of readable images (None when there is none) and the reasons of the others."""
    tensors = [item for _, item in items if torch.is_tensor(item)]
    unreadable = {index: item for index, item in items if not torch.is_tensor(item)}
    return (torch.stack(tensors) if tensors else None), unreadable


def compute_embeddings(
    module: nn.Module,
    images: Sequence[ImageInput],
    settings: EmbedSettings,
    label: str = "images",
    normalized: bool = True,
    skip_unreadable: bool = False,
) -> Embeddings:
    """Embed decoded uint8 RGB arrays, image paths or encoded image bytes with `module`.

    The module runs in eval mode and is put back in its previous mode afterwards, so the trainer can
    call this mid-training. `settings.device` defaults to the device of the module's parameters.
    Images of another size are resized by `settings.interpolation` (`facetrain.data.transforms`: the
    model card says which its model expects). `normalized=False` keeps the (flip-summed) embeddings'
    norms, which IJB's template pooling weighs faces by. An image that cannot be read stops the whole batch (an
    evaluation needs every image of its pairs), or with `skip_unreadable` is left out and named in
    the result, so one bad file of thousands costs nothing embedded before it.
    """
    if len(images) == 0:
        raise ValueError("no images to embed")
    device = torch.device(settings.device) if settings.device is not None else _module_device(module)
    transform = build_eval_transform(settings.image_size, settings.interpolation)
    num_workers = settings.num_workers
    loader = DataLoader(
        _ImageDataset(images, transform, label, skip_unreadable),
        # no batch is larger; a huge --batch-size is no overflow
        batch_size=min(settings.batch_size, len(images)),
        num_workers=num_workers,
        worker_init_fn=init_loader_worker if num_workers > 0 else None,
        multiprocessing_context=worker_context() if num_workers > 0 else None,
        collate_fn=_collate,
    )
    was_training = module.training
    module.eval()
    vectors, norms, unreadable = [], [], {}
    try:
        with (
            torch.no_grad(),
            ProgressBar(
                total=len(images), desc=f"embedding {label}", unit="img", disable=not settings.progress
            ) as bar,
        ):
            for batch, left_out in loader:
                unreadable.update(left_out)
                bar.update(len(left_out))
                if batch is None:
                    continue
                batch = batch.to(device)
                raw = module(batch)
                if raw.ndim != 2:
                    raise ValueError(
                        f"the model must map (B, 3, H, W) to (B, D) embeddings, got shape {tuple(raw.shape)}"
                    )
                norms.append(raw.float().norm(dim=1).cpu())
                combined = raw + module(torch.flip(batch, dims=[3])) if settings.flip else raw
                combined = combined.float()
                vectors.append((nn.functional.normalize(combined, dim=1) if normalized else combined).cpu())
                bar.update(len(batch))
    finally:
        module.train(was_training)
    if not vectors:
        return Embeddings(np.zeros((0, 0), np.float32), float("nan"), unreadable)
    row_norms = torch.cat(norms)
    return Embeddings(torch.cat(vectors).numpy(), float(row_norms.mean()), unreadable, row_norms.numpy())


def embed_images(module: nn.Module, images: Sequence[ImageInput], settings: EmbedSettings) -> np.ndarray:
    """Just the L2-normalized embeddings (N, D) of `compute_embeddings`."""
    return compute_embeddings(module, images, settings).vectors


def _module_device(module: nn.Module) -> torch.device:
    parameter = next(iter(module.parameters()), None)
    return parameter.device if parameter is not None else torch.device("cpu")
