"""Margin-softmax heads: the class-sharded head and the baselines it is measured against."""

from facetrain.heads.dense import DenseMarginHead
from facetrain.heads.margins import MARGINS, Margin, build_margin
from facetrain.heads.naive import NaiveModelParallelHead
from facetrain.heads.partition import ClassRange, all_class_ranges, class_range
from facetrain.heads.sharded import ShardedMarginHead

__all__ = [
    "MARGINS",
    "ClassRange",
    "DenseMarginHead",
    "Margin",
    "NaiveModelParallelHead",
    "ShardedMarginHead",
    "all_class_ranges",
    "build_margin",
    "class_range",
]
