"""Margin-softmax heads: the class-sharded head and the dense reference it must equal."""

from facetrain.heads.base import HeadOutput, MarginHead
from facetrain.heads.dense import DenseMarginHead
from facetrain.heads.margins import MARGINS, Margin, build_margin
from facetrain.heads.partition import ClassRange, all_class_ranges, class_range
from facetrain.heads.plan import HeadPlan
from facetrain.heads.sharded import ShardedMarginHead

__all__ = [
    "MARGINS",
    "ClassRange",
    "DenseMarginHead",
    "HeadOutput",
    "HeadPlan",
    "Margin",
    "MarginHead",
    "ShardedMarginHead",
    "all_class_ranges",
    "build_margin",
    "class_range",
]
