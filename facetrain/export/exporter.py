"""`export_model`: turn a training checkpoint into files that serve without the training code."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from facetrain.checkpoint import load_full_head, resolve_checkpoint
from facetrain.errors import FacetrainError
from facetrain.export.formats import DEFAULT_FORMATS, export_format
from facetrain.files import atomic_target, make_output_folder, refuse_to_overwrite
from facetrain.interop.card import CARD_NAME, with_verification_report, write_card
from facetrain.interop.loading import LoadedModel, load_model
from facetrain.interop.safetensors_format import HEAD_NAME, write_head
from facetrain.progress import ProgressBar

CLASSES_NAME = "classes.json"


@dataclass
class ExportResult:
    out_dir: Path
    card: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def export_model(
    source: str | Path,
    out_dir: str | Path,
    formats: tuple[str, ...] | list[str] = DEFAULT_FORMATS,
    with_head: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    verification_report: str | Path | None = None,
    trust_torchscript: bool = False,
) -> ExportResult:
    """Load `source` (a training checkpoint or an exported model) and export it; see `export_loaded`."""
    loaded = load_model(source, "cpu", trust_torchscript)
    return export_loaded(loaded, out_dir, formats, with_head, overwrite, progress, verification_report)


def export_loaded(
    loaded: LoadedModel,
    out_dir: str | Path,
    formats: tuple[str, ...] | list[str] = DEFAULT_FORMATS,
    with_head: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    verification_report: str | Path | None = None,
) -> ExportResult:
    """Write the requested formats, optionally the gathered head, and the card into `out_dir`.

    Each file is written atomically and checked before it replaces anything; the card is written
    last, so a card always describes files that exist and passed their checks. A `facetrain eval`
    verification report, when given, replaces the checkpoint's evaluation results and threshold.
    """
    out_dir = Path(out_dir)
    writers = {name: export_format(name) for name in dict.fromkeys(formats)}
    if not writers:
        raise FacetrainError("--formats is empty; choose from: " + ", ".join(DEFAULT_FORMATS))
    if with_head and loaded.kind != "checkpoint":
        raise FacetrainError(f"--with-head needs a training checkpoint; {loaded.source} is an exported model")
    targets = [out_dir / writer.filename for writer in writers.values()] + [out_dir / CARD_NAME]
    if with_head:
        targets += [out_dir / HEAD_NAME, out_dir / CLASSES_NAME]
    if not overwrite:
        refuse_to_overwrite(targets)
    make_output_folder(out_dir, "-o")

    card = dict(loaded.card, files={})
    if verification_report is not None:
        card = with_verification_report(card, Path(verification_report))
    written = []
    with ProgressBar(list(writers.items()), desc="export", unit="file", disable=not progress) as bar:
        for name, writer in bar:
            bar.set_postfix_str(name)
            card["files"][name] = writer(loaded.module, out_dir, card)
            written.append(out_dir / writer.filename)
    if with_head:
        card["head"] = _export_head(loaded, out_dir)
        written += [out_dir / card["head"][key] for key in ("file", "classes_file") if key in card["head"]]
    write_card(card, out_dir / CARD_NAME)
    return ExportResult(out_dir, card, written + [out_dir / CARD_NAME])


def _export_head(loaded: LoadedModel, out_dir: Path) -> dict[str, Any]:
    """The full head, gathered from however many shards training used, with its class names."""
    weight: torch.Tensor = load_full_head(loaded.source)
    head_config = loaded.card["training"]["config"]["head"]
    sub_centers = int(head_config.get("sub_centers", 1))
    if sub_centers > 1:  # classes x sub-centers x embedding
        weight = weight.view(weight.shape[0], sub_centers, -1)
    metadata = {"margin": str(head_config["margin"]), "scale": str(head_config["scale"])}
    metadata["sub_centers"] = str(sub_centers)
    entry = write_head(weight, out_dir, metadata)
    entry.update(margin=head_config["margin"], scale=head_config["scale"], sub_centers=sub_centers)
    classes = resolve_checkpoint(loaded.source) / CLASSES_NAME
    if classes.is_file():
        with atomic_target(out_dir / CLASSES_NAME) as tmp:
            shutil.copyfile(classes, tmp)
        entry["classes_file"] = CLASSES_NAME
    return entry
