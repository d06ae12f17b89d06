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
sizes of the two embeddings must match (no learned projection yet).

With `loss.teacher_cache: true` each sample's teacher embedding is kept, keyed by its dataset index,
after its first draw, and later epochs read it instead of running the teacher: a run whose images
repeat then pays for the teacher once per image, not once per draw. That is exact only when the
teacher's input is the same at every draw, so the config check refuses it with any random
augmentation on (`data.augment.random_keys`). The cache is one fp32 row per training image, allocated
on the device when the run starts (so a cache that does not fit fails then, not mid-run) and named
with its size in the run's log; each data-parallel rank fills its own from the samples it draws.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional

from facetrain.checkpoint.layout import POINTERS, complete_checkpoints
from facetrain.errors import EveryRankError, FacetrainError
from facetrain.heads import collectives
from facetrain.interop.loading import checkpoint_behind, load_model
from facetrain.models.state_match import first_nonfinite
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


class TeacherCache:
    """The teacher's embedding of each of `num_samples` training images once computed, on `device`.

    Which rows are filled is kept on the host, where the batch's indices are, so a lookup never waits
    for the device; only the missing rows of a batch go through the teacher."""

    def __init__(self, num_samples: int, embedding_size: int, device: torch.device):
        self.table = torch.empty(num_samples, embedding_size, dtype=torch.float32, device=device)
        self.filled = np.zeros(num_samples, dtype=bool)
        self.computed = self.served = 0  # teacher embeddings computed, and read from the table

    @property
    def bytes(self) -> int:
        return self.table.numel() * self.table.element_size()

    def describe(self) -> str:
        rows, size = self.table.shape
        return (
            f"loss.teacher_cache: up to {rows} teacher embeddings of size {size} kept, "
            f"{self.bytes / 2**20:.1f} MiB of {self.table.device} per rank"
        )

    def embeddings(self, indices: torch.Tensor, images: torch.Tensor, teacher) -> torch.Tensor:
        """The teacher's embeddings of the batch's samples (`indices`, on the host), `teacher(images)`
        run on the samples not seen before only."""
        host = indices.numpy()
        missing = np.flatnonzero(~self.filled[host])
        # a sample drawn twice in one batch (the identity sampler repeats a small identity's images) once
        missing = missing[np.sort(np.unique(host[missing], return_index=True)[1])]
        device_indices = indices.to(self.table.device, non_blocking=True)
        if missing.size:
            rows = torch.from_numpy(missing).to(images.device)
            computed = teacher(images if missing.size == len(host) else images.index_select(0, rows))
            self.table.index_copy_(0, device_indices.index_select(0, rows), computed.float())
            self.filled[host[missing]] = True
        self.computed += int(missing.size)
        self.served += len(host) - int(missing.size)
        return self.table.index_select(0, device_indices)


class Distillation:
    """What the step adds to the loss: `weight x distillation_loss(student's embeddings, teacher's)`,
    the teacher's read from `cache` where it holds them."""

    def __init__(
        self,
        teacher: nn.Module,
        image_size: tuple[int, int],
        kind: str,
        weight: float,
        cache: TeacherCache | None = None,
    ):
        self.teacher = teacher.eval().requires_grad_(False)
        self.image_size, self.kind, self.weight = tuple(image_size), kind, weight
        self.cache = cache

    def teacher_embeddings(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            if tuple(images.shape[-2:]) != self.image_size:
                images = functional.interpolate(
                    images, size=self.image_size, mode="bilinear", align_corners=False
                )
            return self.teacher(images)

    def __call__(
        self,
        images: torch.Tensor,
        outputs: torch.Tensor | tuple[torch.Tensor, ...],
        indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`indices`: the samples' dataset indices (on the host), which the cache needs."""
        student = (
            outputs[0] if isinstance(outputs, tuple) else outputs
        )  # margin_triplet: (embeddings, features)
        if self.cache is None:
            teacher = self.teacher_embeddings(images)
        elif indices is None:
            raise ValueError(
                "a cached teacher needs the batch's sample indices (build_train_loader with_indices)"
            )
        else:
            teacher = self.cache.embeddings(indices, images, self.teacher_embeddings)
        return self.weight * distillation_loss(student, teacher, self.kind)


def pin_teacher(
    cfg: LossConfig, recorded: str | None, group: collectives.ProcessGroup | None = None
) -> str | None:
    """Set `cfg.teacher`, in place, to the checkpoint a run-folder teacher names, and return the line
    that says so (None when nothing changed). `recorded`: on a resume, the teacher the checkpoint was
    saved with; when it is a checkpoint of the run folder `cfg.teacher` names, it stays the teacher,
    and one since removed is refused rather than replaced by that run's newer one.

    Collective over `group` (the run's control group): rank 0 looks the checkpoint up and every rank
    takes its answer. Each looking for itself, a teacher run that commits a checkpoint between two
    ranks' looks would give them different teachers."""
    if cfg.teacher is None:  # the same config on every rank: nothing to agree on
        return None
    cfg.teacher, line = collectives.primary_decides(
        lambda: _pinned_teacher(cfg.teacher, recorded), group=group
    )
    return line


def _pinned_teacher(teacher: str, recorded: str | None) -> tuple[str, str | None]:
    """`pin_teacher`'s teacher and line, looked up by this process."""
    given = Path(teacher)
    if recorded is not None and recorded != teacher and Path(recorded).parent == _checkpoints_of(given):
        if Path(recorded) not in complete_checkpoints(Path(recorded).parent.parent):
            raise EveryRankError(
                f"loss.teacher: {given} was pinned at this run's start to {recorded}, which is gone (pruned "
                f"by that run?); restore it, or resume with --set loss.teacher=CHECKPOINT to learn from "
                "another teacher from here on"
            )
        return recorded, None
    try:
        checkpoint = checkpoint_behind(given)
    except FacetrainError as error:
        raise EveryRankError(f"loss.teacher: {error}") from None
    if checkpoint is None:
        return teacher, None
    return str(checkpoint), f"loss.teacher: {given} resolved to {checkpoint}"


def _checkpoints_of(path: Path) -> Path:
    """The checkpoints folder a run folder, checkpoints folder or pointer names its checkpoints in."""
    if path.name == "checkpoints":
        return path
    return path.parent if path.name in POINTERS else path / "checkpoints"


def build_distillation(
    cfg: LossConfig, embedding_size: int, device: torch.device, num_samples: int = 0
) -> Distillation | None:
    """The run's distillation, None without `loss.teacher`; a teacher that cannot be loaded or whose
    embedding size is not the student's is one line, and so is a cache (`loss.teacher_cache`, one row
    for each of the `num_samples` training images) that does not fit on `device`."""
    if cfg.teacher is None:
        return None
    try:
        loaded = load_model(cfg.teacher, device=device)
    except FacetrainError as error:
        raise EveryRankError(f"loss.teacher: {error}") from None
    nonfinite = first_nonfinite(loaded.module.state_dict())
    if nonfinite is not None:
        raise EveryRankError(
            f"loss.teacher: {cfg.teacher}: {nonfinite}; it comes from a diverged run or is damaged and "
            "would teach NaN: choose an earlier checkpoint of that run"
        )
    if loaded.embedding_size != embedding_size:
        raise EveryRankError(
            f"loss.teacher: {cfg.teacher} gives {loaded.embedding_size}-d embeddings and this run's student "
            f"{embedding_size}-d; set model.embedding_size={loaded.embedding_size} (a projection between "
            "sizes is not supported)"
        )
    cache = None
    if cfg.teacher_cache:
        try:
            cache = TeacherCache(num_samples, embedding_size, device)
        except torch.OutOfMemoryError:
            size = num_samples * embedding_size * 4 / 2**30
            raise EveryRankError(
                f"loss.teacher_cache: {num_samples} teacher embeddings of size {embedding_size} "
                f"({size:.1f} GiB) do not fit on {device}; set loss.teacher_cache: false"
            ) from None
    return Distillation(
        loaded.module.to(device), loaded.image_size, cfg.teacher_loss, cfg.teacher_weight, cache
    )
