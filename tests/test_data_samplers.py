"""Samplers: each epoch split over ranks without overlap, reshuffled per epoch, resumable on any rank count."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from facetrain.data import build_train_dataset, build_train_loader
from facetrain.data.config import DataConfig
from facetrain.data.samplers import IdentitySampler, ResumableDistributedSampler
from facetrain.errors import EveryRankError, FacetrainError
from tests.support.distributed import run_distributed
from tests.support.images import random_rgb, write_image


def rank_orders(
    num_samples: int,
    world_size: int,
    epoch: int = 0,
    consumed: int = 0,
    drop_last: bool = True,
    seed: int = 0,
) -> list[list[int]]:
    orders = []
    for rank in range(world_size):
        sampler = ResumableDistributedSampler(num_samples, rank, world_size, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch, consumed)
        orders.append(list(sampler))
        assert len(sampler) == len(orders[-1])
    return orders


def interleave(orders: list[list[int]]) -> list[int]:
    """The global order: step i takes position i of every rank, rank 0 first."""
    return [index for step in zip(*orders) for index in step]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("num_samples", [23, 24])
def test_drop_last_epoch_gives_each_index_at_most_once_and_drops_under_a_rank(world_size, num_samples):
    orders = rank_orders(num_samples, world_size)
    seen = [index for order in orders for index in order]
    assert len(seen) == len(set(seen))
    assert num_samples - len(seen) == num_samples % world_size
    assert len({len(order) for order in orders}) == 1


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_padded_epoch_gives_every_index_and_repeats_only_to_even_out(world_size):
    orders = rank_orders(23, world_size, drop_last=False)
    seen = [index for order in orders for index in order]
    assert set(seen) == set(range(23))
    assert len(seen) - 23 == (-23) % world_size
    assert len({len(order) for order in orders}) == 1


def test_each_epoch_is_reshuffled_and_seeded():
    first, second = interleave(rank_orders(40, 2, epoch=0)), interleave(rank_orders(40, 2, epoch=1))
    assert sorted(first) == sorted(second) and first != second
    assert interleave(rank_orders(40, 2, epoch=1)) == second
    assert interleave(rank_orders(40, 2, epoch=1, seed=5)) != second


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("consumed", [0, 6, 12, 17])
def test_resuming_from_a_position_gives_the_same_remaining_order(world_size, consumed):
    full = interleave(rank_orders(30, 1, epoch=3, drop_last=False))
    resumed = interleave(rank_orders(30, world_size, epoch=3, consumed=consumed))
    remaining = full[consumed:]
    assert resumed == remaining[: len(remaining) - len(remaining) % world_size]


def test_a_position_taken_on_two_ranks_continues_on_three():
    num_samples, batch = 50, 4
    two = rank_orders(num_samples, 2, epoch=1)
    steps_done = 3
    used = [index for order in two for index in order[: steps_done * batch]]
    consumed = steps_done * batch * 2
    three = rank_orders(num_samples, 3, epoch=1, consumed=consumed)
    rest = [index for order in three for index in order]
    everything = used + rest
    assert len(everything) == len(set(everything))
    assert num_samples - len(everything) < 3
    assert (
        interleave(three) == interleave(rank_orders(num_samples, 1, epoch=1))[consumed : consumed + len(rest)]
    )


def test_sampler_rejects_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="outside"):
        ResumableDistributedSampler(10, 2, 2)


def identity_batches(labels: np.ndarray, batch_size: int, k: int, world_size: int, consumed: int = 0):
    per_rank = []
    for rank in range(world_size):
        sampler = IdentitySampler(labels, batch_size, k, rank, world_size, seed=1)
        sampler.set_epoch(2, consumed)
        order = list(sampler)
        assert len(order) == len(sampler)
        per_rank.append([order[i : i + batch_size] for i in range(0, len(order), batch_size)])
    return per_rank


def test_identity_sampler_gives_p_identities_of_k_images_disjoint_over_ranks():
    labels = np.repeat(np.arange(12), [5, 3, 4, 6, 2, 4, 4, 5, 3, 7, 4, 1])
    per_rank = identity_batches(labels, batch_size=6, k=2, world_size=2)
    assert len(per_rank[0]) == len(per_rank[1]) == 2  # 12 identities / (P=3 x 2 ranks)
    for step in zip(*per_rank):
        step_identities = []
        for batch in step:
            batch_labels = labels[batch]
            identities, counts = np.unique(batch_labels, return_counts=True)
            assert len(identities) == 3 and (counts == 2).all()
            step_identities += identities.tolist()
        assert len(step_identities) == len(set(step_identities))


def test_identity_sampler_resumes_with_the_remaining_batches():
    labels = np.repeat(np.arange(16), 4)
    full = identity_batches(labels, batch_size=4, k=2, world_size=2)
    resumed = identity_batches(labels, batch_size=4, k=2, world_size=2, consumed=2 * 4 * 2)
    assert [batches[2:] for batches in full] == resumed


def test_identity_sampler_errors_are_one_line():
    labels = np.repeat(np.arange(3), 4)
    with pytest.raises(FacetrainError, match="multiple of data.images_per_identity"):
        IdentitySampler(labels, 5, 2, 0, 1)
    with pytest.raises(FacetrainError, match="needs 4 identities per global batch"):
        IdentitySampler(labels, 4, 2, 0, 2)


def test_a_set_with_no_full_batch_per_rank_names_the_numbers_and_what_to_set():
    cfg = DataConfig(num_workers=0)
    dataset = list(range(100))  # the distributed sampler needs only the length
    with pytest.raises(EveryRankError) as caught:
        build_train_loader(dataset, cfg, batch_size=64, rank=0, world_size=2, seed=0)
    assert str(caught.value) == (
        "the training set gives no full batch per rank: 100 images over 2 ranks is 50 a rank, fewer than "
        "train.batch_size 64; set train.batch_size=50 or less, or train on at most 1 rank, or add images"
    )
    with pytest.raises(EveryRankError, match=r"is 0 a rank, fewer than train.batch_size 64; add images$"):
        build_train_loader(dataset[:1], cfg, batch_size=64, rank=0, world_size=2, seed=0)
    loader, _ = build_train_loader(dataset, cfg, batch_size=50, rank=1, world_size=2, seed=0)
    assert len(loader) == 1


def _loader_labels(rank: int, world_size: int, root: str, consumed: int) -> list[list[int]]:
    """The label batches this rank's training loader yields from `consumed` on (each image is its own label)."""
    cfg = DataConfig(source="folder", path=root, image_size=[8, 8], num_workers=0)
    dataset = build_train_dataset(cfg)
    loader, sampler = build_train_loader(dataset, cfg, batch_size=3, rank=rank, world_size=world_size, seed=7)
    sampler.set_epoch(0, consumed)
    return [labels.tolist() for _, labels in loader]


@pytest.mark.slow
def test_training_loaders_resume_on_three_ranks_where_two_stopped(tmp_path: Path):
    rng = np.random.default_rng(0)
    for index in range(40):
        write_image(tmp_path / f"p{index:02d}" / "0.png", random_rgb(rng, 8, 8))  # label == index
    steps, batch_size = 2, 3
    used = [index for order in rank_orders(40, 2, seed=7) for index in order[: steps * batch_size]]
    rest = run_distributed(_loader_labels, 3, str(tmp_path), len(used))
    seen = used + [label for batches in rest for batch in batches for label in batch]
    assert len(seen) == len(set(seen))
    assert 40 - len(seen) < 3 * 3  # drop_last: less than one global batch of 3 ranks x 3 images
    assert len({len(batches) for batches in rest}) == 1
    assert all(len(batch) == batch_size for batches in rest for batch in batches)
