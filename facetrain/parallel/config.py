"""The `parallel` section of a run's config: the process group's backend and timeout, and the pipeline
stages; the schedule is checked against the pipeline schedules this package registers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from facetrain.config.bounds import BATCH_SIZE
from facetrain.config.checks import EachNotEmpty, OneOf, Registered, Within, at_least, setting
from facetrain.config.validate import Problem
from facetrain.parallel.pipeline_schedules import PIPELINE_SCHEDULES

TIMEOUT_S = Within(0, 30 * 24 * 3600, "(]")  # 30 days: a longer wait is a typo, not a slow collective


@dataclass
class ParallelConfig:
    # auto (nccl on CUDA, gloo on CPU) | gloo | nccl
    backend: str = setting("auto", OneOf(("auto", "gloo", "nccl")))
    # a collective waiting longer than this fails instead of hanging; a rank outlives a killed launcher
    # by at most this
    timeout_s: float = setting(300.0, TIMEOUT_S)
    pipeline_stages: int = setting(1, at_least(1))  # and dividing the world size
    microbatches: int = setting(4, BATCH_SIZE)  # and dividing train.batch_size
    schedule: str = setting("gpipe", Registered(PIPELINE_SCHEDULES))  # | 1f1b
    split_points: list[str] = setting([], EachNotEmpty())  # module names; empty: balance by cost


def schedule_problems(parallel: ParallelConfig) -> Iterator[Problem]:
    """The rules of the pipeline's own settings; the pipeline's rules on other sections are the run's."""
    stages = parallel.pipeline_stages
    if parallel.schedule == "1f1b" and parallel.microbatches < stages:
        yield (
            "parallel.microbatches",
            parallel.microbatches,
            f"must be >= parallel.pipeline_stages ({stages}) with parallel.schedule '1f1b'",
        )
    if parallel.split_points and len(parallel.split_points) != stages - 1:
        yield (
            "parallel.split_points",
            parallel.split_points,
            f"must name parallel.pipeline_stages - 1 = {stages - 1} modules, or none to balance by cost",
        )
