"""Everything that knows about several processes (layer 2): the parallel layout (`dims`: ParallelDims,
the mesh, each rank's device), DDP and pipeline stages (`parallelize`, `data_parallel`, `pipeline`,
`pipeline_split`), starting local ranks through torch elastic's process layer (`local_processes`, used
by training's `launch` and by the benchmarks' and tests' `workers` pool), recording their errors for the
launcher (`launch`, `launcher_watch`, `attempt_store`) and naming the rank at fault when a collective
fails (`failures`).

The collectives themselves live in `facetrain.heads.collectives`, beside the sharded head that needs
them, which keeps the head a library of its own. Model and data code never import torch.distributed;
they receive ranks as plain integers. The `parallel` section of a run's config is
`facetrain.parallel.config.ParallelConfig`.
"""

from facetrain.parallel.dims import ParallelDims, destroy_parallel, init_parallel

__all__ = ["ParallelDims", "destroy_parallel", "init_parallel"]
