"""A training run's whole config: one tree of the sections each component owns, loaded from YAML with
`--set section.key=value` overrides. Every run and every checkpoint saves the resolved tree as YAML.

Defaults describe a sensible face-recognition run; `configs/*.yaml` override what differs. Each
section lives beside the code that reads it and checks its names against that code's registry
(`data`: `facetrain.data.config`, `model`: `facetrain.models.config`, `head`: `facetrain.heads.config`,
`eval`: `facetrain.eval.config`, `parallel`: `facetrain.parallel.config`, `checkpoint`:
`facetrain.checkpoint.config`, `loss`, `optim` and `train`: `facetrain.train.losses`,
`facetrain.train.optim`, `facetrain.train.config`); the loader is the generic
one of `facetrain.config`, and `facetrain.train.run_checks.validate` checks the tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from facetrain.checkpoint.config import CheckpointConfig
from facetrain.checkpoint.layout import read_config_yaml
from facetrain.config.loader import from_dict, load_tree
from facetrain.data.config import DataConfig
from facetrain.eval.config import EvalConfig
from facetrain.heads.config import HeadConfig
from facetrain.models.config import ModelConfig
from facetrain.parallel.config import ParallelConfig
from facetrain.train.config import TrainConfig
from facetrain.train.losses import LossConfig
from facetrain.train.optim import OptimConfig


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The config from `path` (or the defaults) with `section.key=value` overrides applied."""
    return load_tree(Config, path, overrides)


def config_from_dict(raw: Any, source: str = "config") -> Config:
    """A saved config (a checkpoint's config.yaml, an export card's), checked as strictly as a file."""
    return from_dict(Config, raw, source=source)


def checkpoint_config(checkpoint: Path) -> Config:
    """The config a checkpoint was saved with (its config.yaml), as its run's typed tree."""
    return config_from_dict(read_config_yaml(checkpoint), source=str(checkpoint / "config.yaml"))
