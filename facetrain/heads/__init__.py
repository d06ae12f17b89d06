"""Margin-softmax heads (layer 1): the class-sharded head and the dense reference it must equal.

A library of its own: `import facetrain.heads` needs torch and facetrain's layer-0 modules (errors,
registry) only. The collectives it shards over (`collectives`, with their autograd functions) live here,
and the rest of facetrain imports them from here.
"""

from facetrain.heads.base import HeadOutput, MarginHead
from facetrain.heads.dense import DenseMarginHead
from facetrain.heads.margins import MARGINS, Margin, build_margin
from facetrain.heads.options import HeadOptions
from facetrain.heads.partition import ClassRange, all_class_ranges, class_range
from facetrain.heads.plan import HeadPlan
from facetrain.heads.sharded import ShardedMarginHead

__all__ = [
    "MARGINS",
    "ClassRange",
    "DenseMarginHead",
    "HeadOutput",
    "HeadOptions",
    "HeadPlan",
    "Margin",
    "MarginHead",
    "ShardedMarginHead",
    "all_class_ranges",
    "build_margin",
    "class_range",
]
