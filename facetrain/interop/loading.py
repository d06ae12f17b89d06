"""One way to load any facetrain model for inference: a training checkpoint or an exported model.

Nothing here unpickles arbitrary objects or runs a file's code by default: exported weights are
safetensors loaded into a backbone rebuilt from the card's config, and training checkpoints go through
the trainer's weights-only loader. A TorchScript archive is a program (its `forward` can read and
write any file), so it is loaded only when the caller says the file is trusted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from facetrain.checkpoint import (
    check_config_describes_weights,
    load_backbone_weights,
    read_meta,
    resolve_checkpoint,
    saved_model_config,
)
from facetrain.checkpoint.layout import read_config_yaml
from facetrain.config import to_dict
from facetrain.errors import FacetrainError
from facetrain.input_files import files_in, unchanged_while_read
from facetrain.interop.card import (
    CARD_NAME,
    build_card,
    card_image_size,
    card_interpolation,
    card_model_config,
    parse_card,
    read_card,
)
from facetrain.interop.safetensors_format import SAFETENSORS_NAME, read_safetensors_into
from facetrain.interop.torchscript_format import TORCHSCRIPT_NAME, read_torchscript
from facetrain.models import build_backbone


@dataclass
class LoadedModel:
    """A backbone in eval mode with what inference needs to know about it.

    `kind` is "checkpoint" (a training checkpoint, which can also give the head), "safetensors" or
    "torchscript" (exported models).
    """

    module: nn.Module
    image_size: tuple[int, int]
    card: dict[str, Any]
    source: Path
    kind: str

    @property
    def threshold(self) -> float | None:
        """The cosine-similarity threshold verification found, when the model was evaluated."""
        threshold = self.card.get("threshold")
        return None if threshold is None else float(threshold)

    @property
    def embedding_size(self) -> int:
        return int(self.card["embedding_size"])

    @property
    def interpolation(self) -> str:
        """How its inputs are resized (`card_interpolation`; one line for a card naming another)."""
        return card_interpolation(self.card)

    @property
    def step(self) -> int | None:
        """The training step a checkpoint's card records; None for a model without one."""
        return (self.card.get("training") or {}).get("step")


def load_model(
    path: str | Path, device: torch.device | str = "cpu", trust_torchscript: bool = False
) -> LoadedModel:
    """Load a training checkpoint (directory, `last`/`best` pointer or run directory), an export
    directory, its `model.safetensors` (with `model.json` beside it) or, with `trust_torchscript`,
    a TorchScript file (which runs the program it holds)."""
    path = Path(path)
    if not path.exists():
        raise FacetrainError(
            f"model {path} does not exist; pass an export directory, a model file or a training checkpoint"
        )
    with unchanged_while_read(_model_files(path), "model file"):
        if path.is_dir() and (path / CARD_NAME).is_file():
            return _load_export_dir(path, device, trust_torchscript)
        if path.is_file() and path.suffix in FILE_LOADERS:
            return FILE_LOADERS[path.suffix](path, device, trust_torchscript)
        return _load_checkpoint(path, device)


def _model_files(path: Path) -> list[Path]:
    """The files loading `path` reads: a model file and the cards that may sit beside it, or every file
    of the model's folder (an export folder, or the checkpoint a run, pointer or checkpoint names)."""
    if path.is_file() and path.suffix == ".json":  # a card: its export folder is what loads
        return files_in(path.parent)
    if path.is_file() and path.suffix in FILE_LOADERS:
        return [path, path.with_suffix(".json"), path.parent / CARD_NAME]
    return files_in(path if (path / CARD_NAME).is_file() else resolve_checkpoint(path))


def checkpoint_behind(path: str | Path) -> Path | None:
    """The checkpoint `load_model` reads for a path that names whichever is newest when it is read (a
    run folder, its checkpoints folder, a `last`/`best` pointer); None for a path that names one model
    for good (a checkpoint, an export folder, a model file)."""
    path = Path(path)
    if (path.is_dir() and (path / CARD_NAME).is_file()) or (path.is_file() and path.suffix in FILE_LOADERS):
        return None
    checkpoint = resolve_checkpoint(path)
    return None if checkpoint == path else checkpoint


def _load_checkpoint(path: Path, device: torch.device | str) -> LoadedModel:
    """The backbone its config.yaml's model and data sections build, filled with its weights (the
    weight average when the run kept one), from however many ranks wrote it, without a group. The
    card records the config.yaml whole; only those two sections are read, so a checkpoint that `facetrain
    import` wrote with them alone loads as a run's does."""
    checkpoint = resolve_checkpoint(path)
    model, data = saved_model_config(checkpoint)
    module = build_backbone(model, tuple(data.image_size))
    check_config_describes_weights(checkpoint, module)
    load_backbone_weights(checkpoint, module)
    image_size = tuple(getattr(module, "input_size", data.image_size))
    saved = {**read_config_yaml(checkpoint), "model": to_dict(model), "data": to_dict(data)}
    card = build_card(module, saved, read_meta(checkpoint), image_size, path)
    return LoadedModel(module.to(device).eval(), image_size, card, path, "checkpoint")


def _load_export_dir(directory: Path, device: torch.device | str, trust_torchscript: bool) -> LoadedModel:
    card = read_card(directory / CARD_NAME)
    files = card.get("files") or {}
    if "safetensors" in files:
        return _load_safetensors(directory / files["safetensors"]["file"], card, device)
    if "torchscript" in files:
        return _load_torchscript(directory / files["torchscript"]["file"], device, trust_torchscript)
    raise FacetrainError(
        f"{directory} has no {SAFETENSORS_NAME} or {TORCHSCRIPT_NAME} to load; "
        "re-export with --formats safetensors"
    )


def _load_safetensors_file(path: Path, device: torch.device | str, _trust: bool) -> LoadedModel:
    card_path = path.with_suffix(".json")
    if not card_path.is_file():
        raise FacetrainError(
            f"{path} needs its card {card_path.name} beside it (the card names the architecture)"
        )
    return _load_safetensors(path, read_card(card_path), device, card_path)


def _load_safetensors(
    path: Path, card: dict[str, Any], device: torch.device | str, card_path: Path | None = None
) -> LoadedModel:
    card_path = card_path or path.parent / CARD_NAME
    model = card_model_config(card, card_path)
    image_size = card_image_size(card, card_path)
    module = build_backbone(model, image_size=image_size)
    read_safetensors_into(module, path, device)
    return LoadedModel(module.to(device).eval(), image_size, card, path, "safetensors")


def _load_torchscript(path: Path, device: torch.device | str, trust_torchscript: bool) -> LoadedModel:
    if not trust_torchscript:
        raise FacetrainError(
            f"{path} is TorchScript, a program that runs when it is loaded; load the safetensors export "
            f"({SAFETENSORS_NAME} with {CARD_NAME} beside it) instead, or, only for a file you trust, "
            "pass --trust-torchscript (eval, embed, compare, export)"
        )
    module, card_text = read_torchscript(path, device)
    card_path = path.parent / CARD_NAME
    if card_text:
        card = parse_card(card_text, path)
    elif card_path.is_file():
        card = read_card(card_path)
    else:
        raise FacetrainError(f"{path} carries no model card and has no {CARD_NAME} beside it; re-export it")
    return LoadedModel(module, card_image_size(card, path), card, path, "torchscript")


def _reject_onnx(path: Path, device: torch.device | str, _trust: bool) -> LoadedModel:
    """facetrain runs its own models in PyTorch; an .onnx is one it exported (the PyTorch weights sit
    beside it) or one from elsewhere, which `facetrain import insightface` turns into a checkpoint."""
    if (path.parent / CARD_NAME).is_file():
        raise FacetrainError(
            f"{path} is for ONNX runtimes; to use it with facetrain pass its export directory {path.parent}"
        )
    raise FacetrainError(
        f"{path} is an ONNX model, which facetrain does not run; import it first with "
        f"`facetrain import insightface {path} -o {path.with_suffix('')}` and pass {path.with_suffix('')}"
    )


FILE_LOADERS: dict[str, Callable[[Path, torch.device | str, bool], LoadedModel]] = {
    ".safetensors": _load_safetensors_file,
    ".pt": _load_torchscript,
    ".json": lambda path, device, trust: _load_export_dir(path.parent, device, trust),
    ".onnx": _reject_onnx,
}
