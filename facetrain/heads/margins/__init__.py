"""Margins, by name (`MARGINS`): the interface and registry (`base.py`), the classic margins
(`classic.py`), and one module for each quality-aware or curriculum margin."""

from facetrain.heads.margins import adaface, curricularface, elasticface, magface
from facetrain.heads.margins.base import (
    MARGINS,
    Margin,
    NegativeModulation,
    Rows,
    StepMargin,
    build_margin,
    prepare_step,
)
from facetrain.heads.margins.classic import (
    ArcFace,
    Combined,
    CosFace,
    NormalizedSoftmax,
    SphereFace,
    WarmingMargin,
    margin_at_step,
)

__all__ = [
    "MARGINS",
    "ArcFace",
    "Combined",
    "CosFace",
    "Margin",
    "NegativeModulation",
    "NormalizedSoftmax",
    "Rows",
    "SphereFace",
    "StepMargin",
    "WarmingMargin",
    "adaface",
    "build_margin",
    "curricularface",
    "elasticface",
    "magface",
    "margin_at_step",
    "prepare_step",
]
