"""Everything that knows about several processes: process groups, collectives, launching, pipelines.

Model and data code never import torch.distributed; they receive ranks as plain integers.
"""

from facetrain.parallel.env import DistEnv, destroy_distributed, init_distributed

__all__ = ["DistEnv", "destroy_distributed", "init_distributed"]
