"""Weight imprinting (`head.init: class_means`): each rank's shard of the head equals what one process
computing every class's mean embedding writes there, whatever the number of ranks and however the
photos are split among them; and a fine-tune's head starts from its starting network's class means."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from facetrain.data import build_train_dataset
from facetrain.data.dataset import FaceDataset
from facetrain.data.transforms import build_eval_transform
from facetrain.heads import ShardedMarginHead
from facetrain.heads.imprint import ClassMeans
from facetrain.interop.loading import load_model
from facetrain.train.run_config import load_config
from tests.support.distributed import run_distributed
from tests.support.fault_helpers import checkpoint_tensors
from tests.support.train_helpers import run_cli, tiny_config

NUM_CLASSES, EMBEDDING, PHOTOS, BATCH = 7, 5, 17, 4
SUB_CENTERS = (1, 2)


def photos() -> tuple[torch.Tensor, torch.Tensor]:
    """17 photos of classes 0-5 (class 6 has none, so its rows must stay as drawn)."""
    generator = torch.Generator().manual_seed(3)
    embeddings = torch.randn(PHOTOS, EMBEDDING, generator=generator, dtype=torch.float64) * 4
    labels = torch.tensor(
        [0, 1, 2, 3, 4, 5] + torch.randint(0, 6, (PHOTOS - 6,), generator=generator).tolist()
    )
    return embeddings, labels


def drawn_head(sub_centers: int) -> ShardedMarginHead:
    head = ShardedMarginHead(NUM_CLASSES, EMBEDDING, margin="cosface", sub_centers=sub_centers).double()
    head.reset_parameters(seed=11)  # the same full weight at any world size
    return head


def class_means_reference(weight: torch.Tensor, embeddings, labels, sub_centers: int) -> torch.Tensor:
    """Written from the definition: each seen class's rows turned to its normalised mean unit embedding,
    each keeping its norm."""
    rows = weight.clone().view(NUM_CLASSES, sub_centers, EMBEDDING)
    for label in range(NUM_CLASSES):
        mine = embeddings[labels == label]
        if len(mine):
            direction = F.normalize(F.normalize(mine, dim=1).mean(0), dim=0)
            rows[label] = direction * rows[label].norm(dim=1, keepdim=True)
    return rows.view(-1, EMBEDDING)


def imprint_worker(rank: int, world_size: int) -> dict[int, tuple[int, torch.Tensor, int]]:
    """This rank's imprinted shard for each sub-centre count, its photos every world_size-th one, fed
    a batch at a time; with 17 photos on 2 ranks in batches of 4, rank 1 passes no rows in the last round."""
    embeddings, labels = photos()
    mine = list(range(rank, PHOTOS, world_size))
    rounds = math.ceil(math.ceil(PHOTOS / world_size) / BATCH)
    results = {}
    for sub_centers in SUB_CENTERS:
        head = drawn_head(sub_centers)
        means = ClassMeans(head)
        for round_ in range(rounds):
            batch = mine[round_ * BATCH : (round_ + 1) * BATCH]
            means.add(embeddings[batch], labels[batch], BATCH)
        imprinted = means.write()
        results[sub_centers] = (head.class_start, head.weight.detach().clone(), imprinted)
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_every_shard_equals_one_process_class_means(world_size):
    per_rank = [imprint_worker(0, 1)] if world_size == 1 else run_distributed(imprint_worker, world_size)
    embeddings, labels = photos()
    for sub_centers in SUB_CENTERS:
        expected = class_means_reference(
            drawn_head(sub_centers).weight.detach(), embeddings, labels, sub_centers
        )
        shards = [rank_results[sub_centers] for rank_results in per_rank]
        assert [start for start, _, _ in shards] == sorted(start for start, _, _ in shards)
        torch.testing.assert_close(
            torch.cat([weight for _, weight, _ in shards]), expected, rtol=0, atol=1e-12
        )
        assert sum(imprinted for _, _, imprinted in shards) == 6  # class 6 has no photo


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A few steps of a tiny run: the network a fine-tune starts from."""
    tmp = tmp_path_factory.mktemp("pretrained")
    result = run_cli("train", "-c", str(tiny_config(tmp, train={"steps": 4}, checkpoint={"every": 4})))
    assert result.returncode == 0, result.stderr
    return tmp


def test_a_fine_tune_starts_from_its_starting_networks_class_means(pretrained, tmp_path):
    # an lr of 1e-9 leaves the imprinted head where the pass put it, to well within the tolerance below
    config = tiny_config(
        tmp_path,
        data={"path": str(pretrained / "synth"), "num_workers": 1},  # the pass's loader workers too
        model={"init": str(pretrained / "run")},
        head={"init": "class_means"},
        optim={"lr": 1e-9},
        train={"steps": 1},
        checkpoint={"every": 1},
    )
    result = run_cli("train", "-c", str(config), "--nproc", "2")
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "run" / "train.log").read_text()
    assert "head imprinted from" in log and "12 of 12 classes start at their photos' mean embedding" in log

    cfg = load_config(config)
    dataset = build_train_dataset(cfg.data)
    plain = FaceDataset(dataset.table, build_eval_transform(cfg.data.image_size))
    network = load_model(pretrained / "run").module
    with torch.no_grad():
        pairs = [(network(images).double(), labels) for images, labels in DataLoader(plain, batch_size=16)]
    embeddings, labels = torch.cat([e for e, _ in pairs]), torch.cat([label for _, label in pairs])
    (head_key,) = [key for key in checkpoint_tensors(tmp_path / "run") if key.endswith("head.weight")]
    weight = checkpoint_tensors(tmp_path / "run")[head_key].double()
    for label in range(dataset.num_classes):
        mean = F.normalize(embeddings[labels == label], dim=1).mean(0)
        assert F.cosine_similarity(weight[label], mean, dim=0) > 1 - 1e-6, label


def test_class_means_without_a_pretrained_start_is_one_line(tmp_path):
    result = run_cli("train", "-c", str(tiny_config(tmp_path, head={"init": "class_means"})))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "head.init" in lines[0] and "needs model.init" in lines[0]
