"""Augmentation is a function of (seed, epoch, position): the same tensors whatever the workers, the rank
count, or a resume in the middle of an epoch."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from facetrain.data import build_train_dataset, build_train_loader
from facetrain.data.config import AugmentConfig, DataConfig
from facetrain.data.sample_key import SampleKey, augment_seeds
from facetrain.data.samplers import IdentitySampler, ResumableDistributedSampler
from tests.support.images import random_rgb, write_image

SEED, IMAGES = 11, 36
EVERY_AUGMENT = AugmentConfig(
    horizontal_flip=True, random_resized_crop=True, crop_scale=[0.5, 1.0], color_jitter=0.4
)


@pytest.fixture(scope="module")
def faces(tmp_path_factory) -> Path:
    """One image per identity, so a batch's labels say which images it holds."""
    root = tmp_path_factory.mktemp("faces")
    rng = np.random.default_rng(0)
    for index in range(IMAGES):
        write_image(root / f"p{index:02d}" / "0.png", random_rgb(rng, 20, 16))
    return root


def loader_batches(
    root: Path, workers: int, batch_size: int, rank: int, world_size: int, epoch: int, consumed: int = 0
) -> list[tuple[torch.Tensor, list[int]]]:
    cfg = DataConfig(
        source="folder", path=str(root), image_size=[12, 10], num_workers=workers, augment=EVERY_AUGMENT
    )
    loader, sampler = build_train_loader(build_train_dataset(cfg), cfg, batch_size, rank, world_size, SEED)
    sampler.set_epoch(epoch, consumed)
    return [(images, labels.tolist()) for images, labels in loader]


def by_label(batches: list[tuple[torch.Tensor, list[int]]]) -> dict[int, torch.Tensor]:
    return {label: images[row] for images, labels in batches for row, label in enumerate(labels)}


def test_a_sample_gets_the_same_tensor_whatever_the_workers_and_ranks(faces):
    one_rank = by_label(loader_batches(faces, workers=0, batch_size=6, rank=0, world_size=1, epoch=1))
    three_ranks = {}
    for rank in range(3):
        three_ranks.update(by_label(loader_batches(faces, 2, batch_size=2, rank=rank, world_size=3, epoch=1)))
    assert sorted(one_rank) == sorted(three_ranks) == list(range(IMAGES))
    for label, tensor in one_rank.items():
        assert torch.equal(tensor, three_ranks[label]), label
    next_epoch = by_label(loader_batches(faces, workers=0, batch_size=6, rank=0, world_size=1, epoch=2))
    changed = sum(not torch.equal(one_rank[label], next_epoch[label]) for label in one_rank)
    assert changed == IMAGES  # crop and jitter draw anew every epoch


@pytest.mark.slow
def test_a_resumed_loader_continues_with_the_same_batches_and_tensors(faces):
    steps_done, batch_size = 2, 3
    for rank in range(2):
        straight = loader_batches(faces, 2, batch_size, rank, 2, epoch=3)
        resumed = loader_batches(faces, 2, batch_size, rank, 2, epoch=3, consumed=steps_done * batch_size * 2)
        assert len(resumed) == len(straight) - steps_done > 0
        for (images, labels), (expected_images, expected_labels) in zip(resumed, straight[steps_done:]):
            assert labels == expected_labels and torch.equal(images, expected_images)


def test_a_two_rank_position_resumes_on_one_rank_with_the_same_global_batches(faces):
    steps_done, batch_size = 2, 3
    ranks = [loader_batches(faces, 0, batch_size, rank, 2, epoch=0) for rank in range(2)]
    one = loader_batches(faces, 0, 2 * batch_size, 0, 1, epoch=0, consumed=steps_done * 2 * batch_size)
    for step, (images, labels) in enumerate(one, start=steps_done):
        global_batch = {**by_label([ranks[0][step]]), **by_label([ranks[1][step]])}
        assert sorted(labels) == sorted(global_batch)
        for row, label in enumerate(labels):
            assert torch.equal(images[row], global_batch[label])


def test_reading_a_key_leaves_the_callers_random_stream_alone(faces):
    cfg = DataConfig(source="folder", path=str(faces), image_size=[12, 10], augment=EVERY_AUGMENT)
    dataset = build_train_dataset(cfg)
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    first = dataset[SampleKey(3, augment_seed=123)][0]
    assert torch.equal(torch.rand(4), expected)
    assert torch.equal(dataset[SampleKey(3, augment_seed=123)][0], first)
    assert not torch.equal(dataset[SampleKey(3, augment_seed=124)][0], first)


def test_keys_are_indices_that_survive_pickling():
    key = SampleKey(7, augment_seed=2**62 + 5)
    copy = pickle.loads(pickle.dumps(key))
    assert isinstance(copy, SampleKey) and copy == 7 and copy.augment_seed == key.augment_seed
    assert torch.tensor([key, 3]).tolist() == [7, 3]


def test_augment_seeds_are_distinct_valid_torch_seeds_per_seed_epoch_and_position():
    positions = np.arange(10_000)
    seeds = augment_seeds(SEED, 0, positions)
    assert len(set(seeds.tolist())) == len(positions) and seeds.min() >= 0
    torch.Generator().manual_seed(int(seeds.max()))
    assert not set(seeds.tolist()) & set(augment_seeds(SEED, 1, positions).tolist())
    assert not set(seeds.tolist()) & set(augment_seeds(SEED + 1, 0, positions).tolist())
    assert augment_seeds(SEED, 0, positions[5:9]).tolist() == seeds[5:9].tolist()


def test_both_samplers_key_each_sample_by_its_global_position():
    sampler = ResumableDistributedSampler(20, rank=1, world_size=2, seed=SEED)
    sampler.set_epoch(4, consumed=6)
    keys = list(sampler)
    positions = 6 + 1 + 2 * np.arange(len(keys))
    assert [key.augment_seed for key in keys] == augment_seeds(SEED, 4, positions).tolist()
    labels = np.repeat(np.arange(4), [1, 1, 5, 5])  # identities 0 and 1 repeat their one image
    identity = IdentitySampler(labels, batch_size=8, images_per_identity=4, rank=0, world_size=1, seed=SEED)
    keys = list(identity)
    assert [key.augment_seed for key in keys] == augment_seeds(SEED, 0, np.arange(16)).tolist()
    assert len({int(key) for key in keys}) < len({key.augment_seed for key in keys}) == 16  # repeats differ


def test_a_loader_with_indices_carries_each_samples_dataset_index(faces):
    """`with_indices` (loss.teacher_cache) appends each sample's dataset index to its batch, through
    loader workers as well: the index names the image, the same in every epoch and on every rank."""
    cfg = DataConfig(
        source="folder",
        path=str(faces),
        image_size=[12, 10],
        num_workers=2,
        augment=AugmentConfig(horizontal_flip=False),
    )
    dataset = build_train_dataset(cfg)
    seen = []
    for rank in range(2):
        loader, sampler = build_train_loader(dataset, cfg, 3, rank, 2, SEED, with_indices=True)
        sampler.set_epoch(1, 0)
        for images, labels, indices in loader:
            assert indices.dtype == torch.int64 and indices.shape == labels.shape
            for image, label, index in zip(images, labels.tolist(), indices.tolist()):
                expected_image, expected_label = dataset[index]
                assert label == expected_label and torch.equal(image, expected_image)
            seen += indices.tolist()
    assert sorted(seen) == list(range(IMAGES))
