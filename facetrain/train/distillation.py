"""Knowledge distillation (`loss.teacher`): the student's embeddings pulled towards a frozen teacher's.

The teacher is any model `facetrain.interop.loading.load_model` loads (a run, a checkpoint, an export
folder, an imported insightface or dlib model), as `model.init` is. It sees the very batch the student
sees, augmentations included, resized to its own input size when that differs, in eval mode and without
autograd: its weights are no parameters of the run, so no optimizer or checkpoint holds them.

The term, weighted by `loss.teacher_weight`, is added to the margin loss (the logged `loss` is the sum):

- `cosine`: mean over the batch of `1 - cos(student, teacher)`;
- `l2`: mean over the batch of `||s/|s| - t/|t|||^2`, the squared distance of the unit embeddings
  (equal to twice the cosine term; kept for users who think of it as a regression).

Both compare directions only, which is what verification uses, so the student keeps its own norm. The
sizes of the two embeddings must match (no learned projection yet), and teacher embeddings are computed
afresh every step (no per-image cache).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from facetrain.errors import EveryRankError, FacetrainError
from facetrain.interop.loading import load_model
from facetrain.train.losses import LossConfig


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    """The unweighted term of the module docstring, in fp32 whatever the autocast."""
    student, teacher = (
        functional.normalize(student.float(), dim=1),
        functional.normalize(teacher.float(), dim=1),
    )
    if kind == "cosine":
        return (1 - (student * teacher).sum(1)).mean()
    return (student - teacher).pow(2).sum(1).mean()


class Distillation:
    """What the step adds to the loss: `weight x distillation_loss(student's embeddings, teacher's)`."""

    def __init__(self, teacher: nn.Module, image_size: tuple[int, int], kind: str, weight: float):
        self.teacher = teacher.eval().requires_grad_(False)
        self.image_size, self.kind, self.weight = tuple(image_size), kind, weight

    def teacher_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if tuple(images.shape[-2:]) != self.image_size:
                images = functional.interpolate(
                    images, size=self.image_size, mode="bilinear", align_corners=False
                )
            return self.teacher(images)

    def __call__(
        self, images: torch.Tensor, outputs: torch.Tensor | tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        student = (
            outputs[0] if isinstance(outputs, tuple) else outputs
        )  # margin_triplet: (embeddings, features)
        return self.weight * distillation_loss(student, self.teacher_embeddings(images), self.kind)


def build_distillation(cfg: LossConfig, embedding_size: int, device: torch.device) -> Distillation | None:
    """The run's distillation, None without `loss.teacher`; a teacher that cannot be loaded or whose
    embedding size is not the student's is one line."""
    if cfg.teacher is None:
        return None
    try:
        loaded = load_model(cfg.teacher, device=device)
    except FacetrainError as error:
        raise EveryRankError(f"loss.teacher: {error}") from None
    if loaded.embedding_size != embedding_size:
        raise EveryRankError(
            f"loss.teacher: {cfg.teacher} gives {loaded.embedding_size}-d embeddings and this run's student "
            f"{embedding_size}-d; set model.embedding_size={loaded.embedding_size} (a projection between "
            "sizes is not supported)"
        )
    return Distillation(loaded.module.to(device), loaded.image_size, cfg.teacher_loss, cfg.teacher_weight)
