"""Everything that knows about several processes: the parallel layout, collectives, DDP, pipelines,
launching and checkpoint I/O.

Model and data code never import torch.distributed; they receive ranks as plain integers. The
`parallel` section of a run's config is `facetrain.parallel.config.ParallelConfig`.
"""

from facetrain.parallel.dims import ParallelDims, destroy_parallel, init_parallel

__all__ = ["ParallelDims", "destroy_parallel", "init_parallel"]
