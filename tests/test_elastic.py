"""What keeps a run the same when its world size changes, piece by piece: the sampler's micro-batches,
the accumulation that holds the global batch, the checkpoint clock all ranks obey, the store prefix an
attempt's ranks agree on, and the line each membership change prints. The whole of it, with real
torchrun agents that lose and regain a node, is tests/test_elastic_nodes.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from facetrain.checkpoint import SaveClock
from facetrain.data.samplers import IdentitySampler, ResumableDistributedSampler
from facetrain.errors import FacetrainError
from facetrain.parallel.attempt_store import ATTEMPT_KEY, agree_on_prefix
from facetrain.parallel.dims import ParallelDims, init_parallel
from facetrain.train.resume import hold_global_batch, membership_line
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config
from facetrain.train.state import TrainState
from facetrain.train.step_gate import StepGate, StopSignals
from tests.support.distributed import free_port, run_distributed

IMAGES, BATCH, GLOBAL = 100, 4, 16


def micro_batches(world_size: int, epoch: int = 0, consumed: int = 0, pk: bool = False) -> list[list[int]]:
    """The epoch's micro-batches in step order: micro-step a of rank r is micro-batch a x world + r."""
    per_rank = []
    for rank in range(world_size):
        if pk:  # 25 identities of 2-6 images, P=2 x K=2
            labels = np.repeat(np.arange(25), np.arange(25) % 5 + 2)  # 100 images
            sampler = IdentitySampler(labels, BATCH, 2, rank, world_size, seed=3, step_samples=GLOBAL)
        else:
            sampler = ResumableDistributedSampler(
                IMAGES, rank, world_size, seed=3, batch_size=BATCH, step_samples=GLOBAL
            )
        sampler.set_epoch(epoch, consumed)
        keys = [int(key) for key in sampler]
        per_rank.append([keys[i : i + BATCH] for i in range(0, len(keys), BATCH)])
    return [batch for round_ in zip(*per_rank) for batch in round_]


def test_every_micro_batch_holds_the_same_images_on_any_number_of_ranks():
    one = micro_batches(1)
    assert micro_batches(2) == one and micro_batches(4) == one
    assert len(one) * BATCH == 96  # the epoch ends on a whole step of 16: 4 images are left out
    assert micro_batches(2, consumed=48) == one[12:]  # resumed mid-epoch on another world size
    assert micro_batches(4, epoch=1) != one


def test_every_identity_micro_batch_holds_the_same_images_on_any_number_of_ranks():
    one = micro_batches(1, pk=True)
    assert micro_batches(2, pk=True) == one and micro_batches(4, pk=True) == one
    assert len(one) == 12  # 25 identities make 3 whole steps of 8 identities (4 micro-batches of P=2)
    assert micro_batches(2, consumed=32, pk=True) == one[8:]  # resumed after two steps on 2 ranks
    assert micro_batches(4, epoch=1, pk=True) != one


def test_the_global_batch_sets_the_accumulation_for_the_world_size():
    cfg = Config()
    cfg.train.batch_size, cfg.train.global_batch = 8, 32
    accumulation = []
    for ranks in (1, 2, 4):
        hold_global_batch(cfg, ranks)  # in place: the run holds one config
        accumulation.append(cfg.optim.grad_accumulation)
    assert accumulation == [4, 2, 1]
    cfg.train.global_batch = None
    hold_global_batch(cfg, 2)
    assert cfg.optim.grad_accumulation == 1  # left as the config gave it


@pytest.mark.parametrize(
    "global_batch, world_size, stages, message",
    [
        (20, None, 1, "train.global_batch = 20: must be a multiple of train.batch_size (8) = 8"),
        (24, 2, 1, "train.global_batch = 24: must be a multiple of train.batch_size (8) x 2 ranks = 16"),
        (16, 2, 2, "train.global_batch = 16: must be unset when parallel.pipeline_stages > 1"),
    ],
)
def test_a_global_batch_that_does_not_divide_is_one_line(global_batch, world_size, stages, message):
    cfg = Config()
    cfg.train.batch_size, cfg.train.global_batch = 8, global_batch
    cfg.parallel.pipeline_stages = stages
    cfg.data.source, cfg.data.path = "synthetic", "/tmp/facetrain-elastic-unused"
    with pytest.raises(FacetrainError) as caught:
        validate(cfg, world_size)
    assert message in str(caught.value)


def test_a_membership_change_is_one_line():
    assert membership_line(2, 1, 30, 34, 2) == (
        "membership: world size 2 -> 1; resumed from step 30, 4 steps lost (steps 31-34 are taken again); "
        "2 micro-batches a rank per step"
    )
    assert membership_line(1, 2, 39, 39, 1) == (
        "membership: world size 1 -> 2; resumed from step 39, 0 steps lost; 1 micro-batch a rank per step"
    )


def _checkpoint_due(rank: int, world_size: int) -> list[bool]:
    """Two steps each with rank 0's interval 0 s (others 1 h), then with rank 0's 1 h (others 0 s)."""
    dims, signals, due = init_parallel(), StopSignals(), []
    for rank0_every_s, others_every_s in ((0.0, 3600.0), (3600.0, 0.0)):
        every = rank0_every_s if rank == 0 else others_every_s
        clock = SaveClock(every_minutes=every / 60)
        gate = StepGate(iter(lambda: 0, None), 1, TrainState(), dims, clock)
        for _ in range(2):
            gate.next_step(signals)
            due.append(gate.checkpoint_due)
            clock.restart()  # as the checkpointer's save does
    return due


def test_rank_0_s_clock_decides_when_every_rank_checkpoints():
    assert run_distributed(_checkpoint_due, 2) == [[True, True, False, False]] * 2


def test_without_a_time_interval_the_clock_never_asks_for_a_checkpoint():
    dims = ParallelDims(1, 0, 0, torch.device("cpu"))
    gate = StepGate(iter(lambda: 0, None), 1, TrainState(), dims)
    gate.next_step(StopSignals())
    assert not gate.checkpoint_due


def test_an_attempt_s_ranks_agree_on_a_fresh_store_prefix_despite_an_earlier_attempt_s_keys():
    server = dist.TCPStore(
        "127.0.0.1", free_port(), is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    server.set(ATTEMPT_KEY, "earlier")  # what a dead attempt left behind
    server.set(f"{ATTEMPT_KEY}/ack/1", "earlier")
    agreed: dict[int, str] = {}

    def rank(number: int, delay: float) -> None:
        time.sleep(delay)
        client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))
        agreed[number] = agree_on_prefix(client, number, 3, time.monotonic() + 30)

    threads = [threading.Thread(target=rank, args=(n, d)) for n, d in ((1, 0.0), (0, 0.2), (2, 0.5))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(set(agreed.values())) == 1 and agreed[0] != "earlier" and len(agreed) == 3
