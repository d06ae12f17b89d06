"""`facetrain bench ...`: the benchmarks whose figures go into docs/benchmarks.md."""

import click

from facetrain.cli.lazy_group import LazyGroup

BENCHMARKS = {
    "head": "facetrain.cli.bench_head:head_command",
    "data": "facetrain.cli.bench_data:data_command",
    "train": "facetrain.cli.bench_train:train_command",
    "eval": "facetrain.cli.bench_eval:eval_command",
    "pipeline": "facetrain.cli.bench_pipeline:pipeline_command",
    "scaling": "facetrain.cli.bench_scaling:scaling_command",
}


@click.group(cls=LazyGroup, lazy_commands=BENCHMARKS)
def bench() -> None:
    """Measure facetrain: each benchmark prints a table and writes JSON (and plots) to --out.

    Every benchmark takes --device auto|cpu|cuda (auto: cuda when torch sees a GPU); on CUDA steps are
    timed until their kernels finish and peak memory is the GPU's allocated bytes.

    \b
    Examples:
      facetrain bench head --classes 100000 --world-sizes 1,2
      facetrain bench data
      facetrain bench pipeline --repeats 3
      facetrain bench train --device cuda --world-size 1
      facetrain bench scaling --cases-only
    """
