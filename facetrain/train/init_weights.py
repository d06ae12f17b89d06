"""Starting a backbone from an earlier model (`model.init`, `facetrain train --init`): fine-tuning.

The earlier model may be a training checkpoint, the checkpoint `facetrain import insightface` writes,
or an export directory; only its backbone is taken, and the run's head starts fresh for the run's own
identities. Keys and shapes must match exactly, so a wrong architecture is one line, not a silent
partial load.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from facetrain.errors import EveryRankError, FacetrainError
from facetrain.export.loading import load_model
from facetrain.models.state_match import first_state_mismatch


def load_initial_backbone(path: str | Path, backbone: nn.Module, backbone_name: str) -> None:
    try:
        loaded = load_model(path)
    except FacetrainError as error:
        raise EveryRankError(f"model.init: {error}") from None
    theirs = loaded.module.state_dict()
    mismatch = first_state_mismatch(theirs, backbone.state_dict(), backbone_name)
    if mismatch is not None:
        trained_as = loaded.card.get("architecture", "another backbone")
        raise EveryRankError(
            f"model.init: {path}: {mismatch}; it holds a {trained_as}: set model.backbone "
            "(and model.embedding_size, data.image_size) to match it"
        )
    backbone.load_state_dict(theirs)
