"""The model card: the JSON beside an exported model that makes it usable without facetrain's source.

It records what a consumer needs to feed the model (input size, channel order, normalization), what
comes out, how it was trained (the resolved config, from which `load_model` rebuilds the backbone),
and how well it verified, including the similarity threshold `facetrain compare` decides with and
the false-accept rate that threshold gave on the evaluation's mismatched pairs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from facetrain import __version__
from facetrain.config import from_dict
from facetrain.data.transforms import RESIZE_AREA, RESIZE_INTERPOLATIONS, RESIZE_LINEAR
from facetrain.errors import FacetrainError
from facetrain.files import atomic_write_text
from facetrain.models.config import ModelConfig
from facetrain.pixels import PIXEL_MEAN, PIXEL_SCALE

CARD_NAME = "model.json"
CARD_FORMAT = "facetrain-model"
CARD_VERSION = 1


def build_card(
    module: nn.Module, config: Any, meta: dict[str, Any], image_size: tuple[int, int], source: Path
) -> dict[str, Any]:
    """The card of a backbone trained with `config`; `meta` is the checkpoint's meta.json.

    `config` is a tree of config sections with a model section: a run's whole config, an import's
    sections (`facetrain.interop.imported_config`), or a checkpoint's config.yaml as the mapping
    `load_model` read, its model section checked. The card records it whole and needs only its model.
    """
    training_config = dict(config) if isinstance(config, Mapping) else dataclasses.asdict(config)
    model = training_config.get("model") or {}
    evaluation = normalized_evaluation(meta.get("evaluation") or {})
    embedding_size = int(getattr(module, "embedding_size", model.get("embedding_size")))
    return {
        "format": CARD_FORMAT,
        "format_version": CARD_VERSION,
        "facetrain_version": __version__,
        "architecture": model.get("backbone"),
        "embedding_size": embedding_size,
        "input": {
            "name": "images",
            "shape": ["batch", 3, image_size[0], image_size[1]],
            "size": [image_size[0], image_size[1]],
            "layout": "NCHW",
            "channels": "RGB",
            "dtype": "float32",
            "normalization": {
                "mean": PIXEL_MEAN,
                "scale": PIXEL_SCALE,
                "formula": f"(pixel - {PIXEL_MEAN}) / {PIXEL_SCALE} on 0-255 RGB values",
            },
            **resize_fields(meta),
        },
        "output": {
            "name": "embeddings",
            "shape": ["batch", embedding_size],
            "l2_normalized": False,
            "similarity": "cosine",
        },
        "training": {
            "step": meta.get("step"),
            "world_size": meta.get("world_size"),
            "num_classes": meta.get("num_classes"),
            "config": training_config,
        },
        "evaluation": evaluation,
        **threshold_fields(evaluation),
        **({"imported_from": meta["imported_from"]} if meta.get("imported_from") else {}),
        "source": str(source),
        "files": {},
    }


def resize_fields(meta: dict[str, Any]) -> dict[str, str]:
    """How inputs of another size are resized: as insightface's inference.py does (bilinear) for a model
    imported from insightface, whose weights learnt from and are scored on crops resized that way;
    facetrain's area interpolation when shrinking for the rest."""
    source = str((meta.get("imported_from") or {}).get("format", ""))
    if source.lower().startswith("insightface"):
        return {
            "interpolation": RESIZE_LINEAR,
            "resize": "to height x width, bilinear (cv2.INTER_LINEAR, as insightface's inference.py; no crop)",
        }
    return {
        "interpolation": RESIZE_AREA,
        "resize": "to height x width, area interpolation when shrinking, bilinear when enlarging (no crop)",
    }


def card_interpolation(card: dict[str, Any]) -> str:
    """The interpolation a model's inputs are resized with; a card from before facetrain recorded it
    means facetrain's own."""
    interpolation = (card.get("input") or {}).get("interpolation", RESIZE_AREA)
    if interpolation not in RESIZE_INTERPOLATIONS:
        raise FacetrainError(
            f"model card of {card.get('source', 'the model')}: input.interpolation {interpolation!r} is not "
            f"one of {', '.join(RESIZE_INTERPOLATIONS)}; re-export the model"
        )
    return interpolation


def with_verification_report(card: dict[str, Any], report_path: Path) -> dict[str, Any]:
    """The card with the results of a `facetrain eval` verification report, which replace the
    checkpoint's own (the report may come from other pairs, or from after training)."""
    try:
        report = json.loads(report_path.read_text())
    except FileNotFoundError:
        raise FacetrainError(
            f"evaluation report {report_path} does not exist; run facetrain eval first"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FacetrainError(f"cannot read evaluation report {report_path}: {error}") from None
    if not isinstance(report, dict) or not isinstance(report.get("threshold"), int | float):
        raise FacetrainError(
            f"{report_path} is not a verification report with a threshold; "
            "pass the NAME.json that `facetrain eval --pairs` wrote"
        )
    evaluation = {**card.get("evaluation", {}), "verification": report}
    return {**card, "evaluation": evaluation, **threshold_fields(evaluation)}


def normalized_evaluation(evaluation: dict[str, Any]) -> dict[str, Any]:
    """Evaluation results keyed by kind; the trainer stores its verification figures unkeyed."""
    if "verification" in evaluation or "accuracy" not in evaluation:
        return dict(evaluation)
    return {"verification": dict(evaluation)}


def threshold_fields(evaluation: dict[str, Any]) -> dict[str, float | None]:
    """The card's `threshold` (cosine similarity) and the FAR and TAR it gave on the evaluation pairs.

    A report written before facetrain recorded them has no FAR or TAR; those stay null rather than
    being guessed.
    """
    verification = evaluation.get("verification") or {}
    return {
        key: None if verification.get(key) is None else float(verification[key])
        for key in ("threshold", "threshold_far", "threshold_tar")
    }


def card_model_config(card: dict[str, Any], where: Path) -> ModelConfig:
    """The model section of the training config stored in a card, from which the backbone is rebuilt."""
    try:
        raw = card["training"]["config"]
    except (KeyError, TypeError):
        raise FacetrainError(f"model card {where} has no training.config; re-export the model") from None
    if not isinstance(raw, dict):
        raise FacetrainError(f"{where}: training.config must be a mapping")
    return from_dict(ModelConfig, raw.get("model", {}), str(where), "model.")


def card_image_size(card: dict[str, Any], where: Path) -> tuple[int, int]:
    try:
        height, width = card["input"]["size"]
    except (KeyError, TypeError, ValueError):
        raise FacetrainError(
            f"model card {where} has no input.size [height, width]; re-export the model"
        ) from None
    if min(int(height), int(width)) < 8:
        raise FacetrainError(
            f"model card {where}: input.size {height}x{width} is below 8x8; re-export the model"
        )
    return int(height), int(width)


def read_card(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FacetrainError(
            f"model card {path} does not exist; export the model with `facetrain export`"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise FacetrainError(f"cannot read model card {path}: {error}") from None
    return parse_card(text, path)


def parse_card(text: str, where: Path) -> dict[str, Any]:
    try:
        card = json.loads(text)
    except json.JSONDecodeError as error:
        raise FacetrainError(f"model card {where} line {error.lineno}: not valid JSON") from None
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise FacetrainError(f'{where} is not a facetrain model card (no "format": "{CARD_FORMAT}")')
    return card


def card_json(card: dict[str, Any]) -> str:
    return json.dumps(card, indent=2, sort_keys=False) + "\n"


def write_card(card: dict[str, Any], path: Path) -> None:
    atomic_write_text(path, card_json(card))
