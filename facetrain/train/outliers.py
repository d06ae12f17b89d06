"""Likely label noise in a run's training set, found by its own trained head (`facetrain outliers RUN`).

Sub-center ArcFace (Deng et al., ECCV 2020) trains K centres a class so that a class's noisy images
gather on centres of their own instead of pulling its main one; after training, the class's dominant
centre is the one most of its images are nearest to, and an image is likely mislabelled when its
nearest centre is another one, or when it lies further than 75 degrees from the dominant one (the
paper's threshold). With K = 1 only the angle tells, and an image nearer another class's centre than
its own is suspect too. The report lists the images for a person to review; nothing is moved or deleted.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from facetrain.checkpoint import load_full_head, read_classes, resolve_checkpoint, stored
from facetrain.checkpoint.names import HEAD_WEIGHT
from facetrain.data.dataset import EncodedImageReader
from facetrain.data.sources import SOURCES
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.files import atomic_target
from facetrain.interop import load_model
from facetrain.train.run_config import checkpoint_config

DEFAULT_MAX_ANGLE = 75.0  # degrees from the dominant sub-center, the sub-center paper's noise threshold
NON_DOMINANT = "non-dominant sub-center"
FAR = "far from its class"
NEARER_OTHER = "closer to another class"
UNREADABLE = "unreadable"
REASONS = (UNREADABLE, NON_DOMINANT, FAR, NEARER_OTHER)
COLUMNS = (
    "path", "label", "identity", "cosine", "dominant_cosine", "dominant_angle", "dominant_sub_center",
    "sub_center", "other_label", "other_identity", "other_cosine", "reason",
)  # fmt: skip
COSINES_A_CHUNK = 1 << 26  # cosines computed at once (256 MiB in fp32), however many classes the head has


@dataclass(frozen=True)
class Scores:
    """Each image against the trained head: its class (`label`, a head row), the nearest centre of
    that class (`cosine`, `sub_center`), the class's dominant centre (`dominant`, `dominant_cosine`)
    and the nearest other class (`other`, -1 with one class; `other_cosine`); rows in the order of
    the images given."""

    label: np.ndarray
    cosine: np.ndarray
    sub_center: np.ndarray
    dominant: np.ndarray
    dominant_cosine: np.ndarray
    other: np.ndarray
    other_cosine: np.ndarray

    @property
    def suspicion(self) -> np.ndarray:
        """How far each image lies from its class's dominant centre beyond the nearest other class:
        its dominant cosine less the other class's (lowest first is most suspect; with one class, its
        dominant cosine)."""
        return self.dominant_cosine - np.where(self.other < 0, 0.0, self.other_cosine)

    def reasons(self, max_angle: float, sub_centers: int) -> list[list[str]]:
        """Why each image is suspect (none: it is not)."""
        far = self.dominant_cosine < math.cos(math.radians(max_angle))
        off_centre = self.sub_center != self.dominant
        nearer_other = self.other_cosine > self.cosine
        return [
            [reason for reason, hit in zip((NON_DOMINANT, FAR, NEARER_OTHER), hits, strict=True) if hit]
            for hits in zip(off_centre & (sub_centers > 1), far, nearer_other, strict=True)
        ]


def score_images(
    embeddings: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, sub_centers: int
) -> Scores:
    """Score L2-normalised `embeddings` (N x D) labelled `labels` (head rows) against the head's
    `weight` (C x K*D, K = `sub_centers`); the dominant centre of a class is the one most of its
    images here are nearest to (the lowest index on a tie)."""
    classes = weight.shape[0]
    centres = torch.nn.functional.normalize(weight.view(classes * sub_centers, -1).to(embeddings), dim=1)
    own, own_index, other, other_label = [], [], [], []
    cosines_to_own = []
    images_a_chunk = max(1, COSINES_A_CHUNK // (classes * sub_centers))
    for start in range(0, len(embeddings), images_a_chunk):
        chunk = embeddings[start : start + images_a_chunk]
        chunk_labels = labels[start : start + images_a_chunk]
        cosines = (chunk @ centres.T).view(len(chunk), classes, sub_centers)
        mine = cosines[torch.arange(len(chunk)), chunk_labels]  # B x K
        cosines_to_own.append(mine)
        best, best_index = mine.max(dim=1)
        own.append(best)
        own_index.append(best_index)
        per_class = cosines.max(dim=2).values
        per_class[torch.arange(len(chunk)), chunk_labels] = -math.inf
        nearest, nearest_label = per_class.max(dim=1) if classes > 1 else (torch.full_like(best, -1.0),) * 2
        other.append(nearest)
        other_label.append(nearest_label.long())
    own_centre = torch.cat(own_index)
    picks = torch.zeros(classes * sub_centers, dtype=torch.long, device=labels.device)
    picks.index_add_(0, labels * sub_centers + own_centre, torch.ones_like(labels))
    dominant_of_class = picks.view(classes, sub_centers).argmax(dim=1)
    dominant = dominant_of_class[labels]
    to_own = torch.cat(cosines_to_own)
    dominant_cosine = to_own[torch.arange(len(labels)), dominant]
    found = (
        labels,
        torch.cat(own),
        own_centre,
        dominant,
        dominant_cosine,
        torch.cat(other_label),
        torch.cat(other),
    )
    return Scores(*(values.cpu().numpy() for values in found))


@dataclass(frozen=True)
class OutlierReport:
    """The rows of the report, most suspect first, and how many images each reason flagged."""

    checkpoint: Path
    images: int
    rows: list[dict[str, str]]
    counts: dict[str, int]

    def summary(self, max_angle: float) -> list[str]:
        flagged = sum(1 for row in self.rows if row["reason"])
        lines = [f"{reason}: {_images(self.counts[reason])}" for reason in REASONS if self.counts[reason]]
        lines.append(
            f"{flagged} of {_images(self.images)} flagged (max angle {max_angle:g} degrees) by "
            f"{self.checkpoint}; review them before cleaning the set, nothing was moved"
        )
        return lines


def _images(count: int) -> str:
    return f"{count} image" if count == 1 else f"{count} images"


class _EncodedImages(Sequence):
    """The encoded bytes of a source's images, read as the embedding loader asks for them."""

    def __init__(self, reader: EncodedImageReader):
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> bytes:
        return self.reader.read(index)


def trained_checkpoint(run: str | Path) -> Path:
    """The checkpoint of `run` (a run directory, a checkpoint or a last/best pointer) whose head scores
    the images, or one line saying why there is none."""
    path = Path(run)
    if not path.exists():
        raise FacetrainError(
            f"{path} does not exist; pass a training run directory or one of its checkpoints"
        )
    checkpoint = resolve_checkpoint(path)
    if HEAD_WEIGHT not in stored(checkpoint):
        raise FacetrainError(
            f"checkpoint {checkpoint} holds no head (an imported backbone?); outliers needs a run trained "
            "with facetrain, whose head knows its classes"
        )
    return checkpoint


def default_report_path(checkpoint: Path) -> Path:
    """outliers.csv in the run directory the checkpoint belongs to."""
    return checkpoint.parent.parent / "outliers.csv"


def find_outliers(
    run: str | Path,
    device: str,
    max_angle: float = DEFAULT_MAX_ANGLE,
    batch_size: int = 128,
    workers: int = 0,
    progress: bool = True,
) -> OutlierReport:
    """Embed every training image of the run's data source (data.source, data.path) with the
    checkpoint's backbone (the weight average when the run kept one), as evaluation does and without
    the flip the head never saw, and score it against the checkpoint's full head."""
    checkpoint = trained_checkpoint(run)
    config = checkpoint_config(checkpoint)
    sub_centers = config.head.sub_centers
    class_names = read_classes(checkpoint)
    weight = load_full_head(checkpoint)
    if not torch.isfinite(weight).all():  # every cosine NaN: no image would be flagged
        raise FacetrainError(
            f"checkpoint {checkpoint}: its head holds NaN or infinite values (the run diverged), so it "
            "scores no image; pass an earlier checkpoint of the run"
        )
    data_path = training_data_path(checkpoint, config.data.path, config.train.output_dir)
    table = SOURCES.build(config.data.source, str(data_path))
    row_of = {name: row for row, name in enumerate(class_names)}
    unknown = [name for name in table.class_names if name not in row_of]
    if unknown:
        raise FacetrainError(
            f"{data_path} has {len(unknown)} identities that {checkpoint} never trained (e.g. "
            f"{unknown[0]!r}); pass the run that trained on this data"
        )
    rows = np.array([row_of[name] for name in table.class_names], dtype=np.int64)[table.labels]
    loaded = load_model(checkpoint, device)
    backbone, image_size = loaded.module, loaded.image_size
    settings = EmbedSettings(
        image_size, batch_size, flip=False, device=device, progress=progress, num_workers=workers
    )
    embedded = compute_embeddings(
        backbone, _EncodedImages(table.reader), settings, label="training images", skip_unreadable=True
    )
    readable = np.array([index for index in range(len(rows)) if index not in embedded.unreadable], np.int64)
    if not np.isfinite(embedded.vectors).all():
        raise FacetrainError(
            f"checkpoint {checkpoint}: its backbone gives NaN or infinite embeddings (the run diverged), so "
            "it scores no image; pass an earlier checkpoint of the run"
        )
    scores = score_images(
        torch.from_numpy(embedded.vectors).to(device),
        torch.from_numpy(rows[readable]).to(device),
        weight,
        sub_centers,
    ) if len(readable) else None  # fmt: skip
    report_rows = [_unreadable_row(table.reader.name(i), rows[i], class_names, why)
                   for i, why in sorted(embedded.unreadable.items())]  # fmt: skip
    counts = dict.fromkeys(REASONS, 0)
    counts[UNREADABLE] = len(report_rows)
    if scores is not None:
        reasons = scores.reasons(max_angle, sub_centers)
        order = sorted(range(len(readable)), key=lambda i: (not reasons[i], scores.suspicion[i]))
        for position in order:
            for reason in reasons[position]:
                counts[reason] += 1
            report_rows.append(
                _row(table.reader.name(readable[position]), scores, position, reasons[position], class_names)
            )
    return OutlierReport(checkpoint, len(rows), report_rows, counts)


def training_data_path(checkpoint: Path, data_path: str, output_dir: str) -> Path:
    """data.path as the run's training read it. A relative one was relative to the folder `train` ran
    in, which the run tells when its output_dir was relative too: the run folder, less output_dir's
    parts (`runs/demo` of /home/me/faces/runs/demo: /home/me/faces). Read relative to the current
    folder instead, it named another set, or nothing, wherever outliers ran from."""
    path = Path(data_path)
    if path.is_absolute():
        return path
    run_dir, output = checkpoint.resolve().parent.parent, Path(output_dir)
    parts = [part for part in output.parts if part != "."]
    if (
        not output.is_absolute()
        and parts
        and ".." not in parts
        and run_dir.parts[-len(parts) :] == tuple(parts)
    ):
        return Path(*run_dir.parts[: -len(parts)]) / path
    return path  # the run does not tell where it ran: as written, from here


def _unreadable_row(path: str, label: int, class_names: list[str], why: str) -> dict[str, str]:
    row = dict.fromkeys(COLUMNS, "")
    row.update(path=path, label=str(label), identity=class_names[label], reason=f"{UNREADABLE}: {why}")
    return row


def write_outlier_report(report: OutlierReport, path: Path) -> None:
    """The report as CSV, replacing `path` only once it is whole."""
    with atomic_target(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(report.rows)


def _row(path: str, scores: Scores, i: int, reasons: list[str], class_names: list[str]) -> dict[str, str]:
    label, other = int(scores.label[i]), int(scores.other[i])
    dominant_cosine = float(np.clip(scores.dominant_cosine[i], -1.0, 1.0))
    return {
        "path": path,
        "label": str(label),
        "identity": class_names[label],
        "cosine": f"{scores.cosine[i]:.4f}",
        "dominant_cosine": f"{dominant_cosine:.4f}",
        "dominant_angle": f"{math.degrees(math.acos(dominant_cosine)):.1f}",
        "dominant_sub_center": str(int(scores.dominant[i])),
        "sub_center": str(int(scores.sub_center[i])),
        "other_label": "" if other < 0 else str(other),
        "other_identity": "" if other < 0 else class_names[other],
        "other_cosine": "" if other < 0 else f"{scores.other_cosine[i]:.4f}",
        "reason": "; ".join(reasons),
    }
