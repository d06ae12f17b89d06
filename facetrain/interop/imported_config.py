"""The sections of a run's config that an imported model fixes, which its checkpoint's config.yaml holds.

A foreign file says what its backbone is (architecture, embedding size, input size) and, for a whole
insightface run, the margin it trained with and the optimizer its state belongs to; nothing else. The
checkpoint records those sections alone, and whatever reads it fills the rest with its own defaults: a
run (`facetrain.train.run_config.checkpoint_config`) as it does for a config file that leaves sections
out, `load_model` by reading only the model and data sections. So the importers build the sections of
the components they know (models/, data/, heads/), never the run's whole tree, which is train/'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from facetrain.data.config import DataConfig
from facetrain.heads.config import HeadConfig
from facetrain.models.config import ModelConfig


@dataclass
class ImportedConfig:
    """An imported backbone's config.yaml: what it is rebuilt from."""

    data: DataConfig
    model: ModelConfig


@dataclass
class ImportedRunConfig(ImportedConfig):
    """An imported training run's config.yaml: the backbone's sections, its head's, and the optimizer
    its state belongs to. `optim` is train's section (layer 3), of which an import knows the name alone,
    so it is written as a mapping; empty when the files held no optimizer state facetrain knows."""

    head: HeadConfig
    optim: dict[str, str]


def backbone_config(architecture: str, embedding_size: int, image_size: tuple[int, int]) -> ImportedConfig:
    """The config an imported backbone is rebuilt from: its architecture and input size, no dropout."""
    return ImportedConfig(
        data=DataConfig(image_size=list(image_size)),
        model=backbone_model(architecture, embedding_size),
    )


def backbone_model(architecture: str, embedding_size: int) -> ModelConfig:
    return ModelConfig(backbone=architecture, embedding_size=embedding_size, dropout=0.0)
