"""What one benchmark rank does to measure one head kind: build it, time its steps and its GEMMs, and take
its peak memory. Every kind is measured here, facetrain's heads (`head_cases.py`) and the peers users would
pick instead (`head_peers.py`), so each figure of a comparison comes from the same code; importing both
registers every kind in the spawned worker that runs this.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import NamedTuple

import torch

import facetrain.bench.head_peers  # noqa: F401  (registers the peers in the worker)
from facetrain.bench.common import peak_memory, timed_repeats
from facetrain.bench.head_bytes import copy_bandwidth
from facetrain.bench.head_cases import BENCH_HEADS, BenchHead, HeadCase
from facetrain.devices import rank_device
from facetrain.heads import collectives
from facetrain.parallel.traffic import count_traffic


def _time_shard_gemms(
    case: HeadCase, rank: int, steps: int, warmup: int, device: torch.device
) -> list[float]:
    """The untiled head's three GEMMs alone, with its operand layouts: what its step cannot beat."""
    classes = case.shard_classes(rank)
    embeddings = torch.randn(case.batch, case.dim, device=device, dtype=case.gemm_dtype)
    weight = torch.randn(classes, case.dim, device=device, dtype=case.gemm_dtype)
    logit_grad = torch.randn(case.batch, classes, device=device, dtype=case.gemm_dtype)

    def gemms() -> None:
        torch.mm(embeddings, weight.t())
        torch.mm(logit_grad, weight)
        torch.mm(logit_grad.t(), embeddings)

    return timed_repeats(gemms, steps, warmup, before_each=collectives.barrier, device=device)


def _timed_steps(
    kind: BenchHead, case: HeadCase, steps: int, warmup: int, with_optimizer: bool, device: torch.device
) -> tuple[list[float], int, dict]:
    """Build the head (and, for a full training step, its optimizer) and its data, time the steps;
    everything it made is freed when it returns."""
    with device:
        head = kind.build(case)
    optimizer = kind.optimizer(head) if with_optimizer else None
    embeddings = torch.randn(case.local_batch, case.dim, device=device).requires_grad_()
    labels = torch.randint(0, case.num_classes, (case.local_batch,), device=device)
    # The last step's collectives are counted (the first also checks every rank's inputs); the counter
    # sees every operator of its step, a few microseconds each, so the other steps run without it.
    # A one-device peer sends nothing, and its torch.compile'd code refuses the counter's dispatch mode.
    counts_at = warmup + steps if kind.sends_bytes else -1
    calls, counted = [0], []

    def prepare() -> None:
        embeddings.grad = None
        head.zero_grad(set_to_none=True)
        collectives.barrier()

    def step() -> None:
        calls[0] += 1
        with count_traffic() if calls[0] == counts_at else contextlib.nullcontext() as traffic:
            with case.autocast(device):
                loss = head(embeddings, labels).loss
            loss.backward()
            kind.after_backward(head, case)
            if optimizer is not None:
                optimizer.step()
        if traffic is not None:
            counted.append(traffic)

    step_s = timed_repeats(step, steps, warmup, before_each=prepare, device=device)
    if not counted:
        return step_s, 0, {}
    return step_s, counted[0].bytes_sent, dict(counted[0].by_op)


class StepTiming(NamedTuple):
    """How a case is timed: `steps` timed steps after `warmup` untimed ones, rank r seeded `seed + r`."""

    steps: int
    warmup: int
    seed: int


def measure_case(
    rank: int,
    world_size: int,
    case: HeadCase,
    timing: StepTiming,
    with_optimizer: bool = False,
    device_kind: str = "cpu",
    time_gemms: bool = True,
) -> dict:
    """One rank's figures for `case`: step times, peak memory growth, bytes sent, GEMM times.

    A step is forward + backward (+ the optimizer with `with_optimizer`; the tiled head's own update is
    part of its backward). Where the kind has a model of its step's memory traffic, the copy bandwidth of
    this rank's device (measured once a process) comes with the figures. Runs inside a benchmark worker; ranks line up at a barrier before every
    step, so each step's time on the slowest rank is the step time of the group. `time_gemms=False`
    skips the GEMM timing, whose fp32 C x D and B x C operands would not fit beside a bf16 head sized
    to fill the memory (the capacity benchmark's largest runs).
    """
    kind = BENCH_HEADS.build(case.head)
    device = rank_device(device_kind, rank)
    steps, warmup = timing.steps, timing.warmup
    torch.manual_seed(timing.seed + rank)
    # a tiny run first, outside the window: thread pools and library workspaces start lazily
    _timed_steps(kind, replace(case, num_classes=case.world_size), 1, 0, with_optimizer, device)
    with peak_memory(device) as memory:
        step_s, bytes_sent, by_op = _timed_steps(kind, case, steps, warmup, with_optimizer, device)
    return {
        "rank": rank,
        "threads": torch.get_num_threads(),
        "step_s": step_s,
        "bytes_sent": bytes_sent,
        "bytes_by_op": by_op,
        "peak_memory_bytes": memory.growth_bytes,
        "memory_method": memory.method,
        "gemm_s": _time_shard_gemms(case, rank, steps, warmup, device)
        if kind.times_gemms and time_gemms
        else None,
        "copy_bandwidth": copy_bandwidth(device.type) if kind.traffic(case) is not None else None,
    }
