"""One typed config tree, loaded from YAML with `--set section.key=value` overrides."""

from facetrain.config.loader import apply_override, from_dict, load_config, save_config, to_dict
from facetrain.config.schema import (
    AugmentConfig,
    Config,
    DataConfig,
    EvalConfig,
    HeadConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    SynthConfig,
    TrainConfig,
)

__all__ = [
    "AugmentConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "HeadConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "SynthConfig",
    "TrainConfig",
    "apply_override",
    "from_dict",
    "load_config",
    "save_config",
    "to_dict",
]
