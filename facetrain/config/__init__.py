"""A generic typed-YAML loader: a tree of dataclasses from YAML, `--set section.key=value` overrides,
declared field checks and one-line errors that say where a bad value was given.

This package knows no facetrain component. Each component declares its own section beside its code
(`facetrain.models.config.ModelConfig`, ...) and checks it against its own registry; a training run's
whole tree is `facetrain.train.run_config.Config`.
"""

from facetrain.config.loader import (
    apply_override,
    config_source,
    from_dict,
    load_tree,
    override_origins,
    save_config,
    to_dict,
    where_given,
)
from facetrain.config.validate import Problem, field_problems, raise_first, show, validate_section

__all__ = [
    "Problem",
    "apply_override",
    "config_source",
    "field_problems",
    "from_dict",
    "load_tree",
    "override_origins",
    "raise_first",
    "save_config",
    "show",
    "to_dict",
    "validate_section",
    "where_given",
]
