"""One typed config tree, loaded from YAML with `--set section.key=value` overrides, checked by `validate`."""

from facetrain.config.loader import (
    apply_override,
    config_source,
    from_dict,
    load_config,
    override_origins,
    save_config,
    to_dict,
    where_given,
)
from facetrain.config.schema import (
    AugmentConfig,
    Config,
    DataConfig,
    EvalConfig,
    HeadConfig,
    LossConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    SynthConfig,
    TrainConfig,
)
from facetrain.config.validate import validate, validate_section

__all__ = [
    "AugmentConfig",
    "Config",
    "DataConfig",
    "EvalConfig",
    "HeadConfig",
    "LossConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "SynthConfig",
    "TrainConfig",
    "apply_override",
    "config_source",
    "from_dict",
    "load_config",
    "override_origins",
    "save_config",
    "to_dict",
    "validate",
    "validate_section",
    "where_given",
]
