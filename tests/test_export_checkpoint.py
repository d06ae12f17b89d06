"""Acceptance: exports of a 2-rank training checkpoint embed like the checkpoint's backbone, and
`facetrain eval` scores an export exactly as it scores its checkpoint."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from facetrain.checkpoint import CheckpointStates
from facetrain.checkpoint.writer import save_checkpoint
from facetrain.cli import main
from facetrain.eval.set_names import report_file_name
from facetrain.heads import ShardedMarginHead
from facetrain.interop.loading import load_model
from facetrain.parallel.dims import init_parallel
from facetrain.train.state import TrainState
from tests.support.distributed import run_distributed
from tests.support.small_models import IMAGE_SIZE, fresh_backbone, images, small_config

NUM_CLASSES = 10
STEP = 7
EVALUATION = {"accuracy": 0.8, "threshold": 0.25, "flip": False}


def save_two_rank_checkpoint(rank: int, world_size: int, run_dir: str) -> tuple[int, torch.Tensor]:
    """Each rank saves its shard of the head; returns (first class, shard) for the reference."""
    config = small_config()
    config.head.margin, config.head.scale = "cosface", 30.0
    backbone = fresh_backbone(config, seed=1)
    head = ShardedMarginHead(NUM_CLASSES, config.model.embedding_size, margin="cosface", scale=30.0)
    head.reset_parameters(seed=3)
    optimizer = torch.optim.SGD([*backbone.parameters(), head.weight], lr=0.1)
    class_names = [f"person{index}" for index in range(NUM_CLASSES)]
    states = CheckpointStates(TrainState(step=STEP), config, class_names, backbone, head, optimizer, None)
    save_checkpoint(Path(run_dir), init_parallel(), states, EVALUATION, is_best=True)
    return head.class_start, head.weight.detach().clone()


def invoke(*args: object) -> str:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    run = tmp_path_factory.mktemp("run")
    shards = sorted(run_distributed(save_two_rank_checkpoint, 2, str(run)), key=lambda shard: shard[0])
    return run, torch.cat([weight for _, weight in shards])


@pytest.fixture(scope="module")
def exported(run_dir: tuple[Path, torch.Tensor], tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("export")
    invoke("export", run_dir[0] / "checkpoints" / "best", "-o", out, "--with-head", "--quiet", "--overwrite")
    return out


def test_every_format_embeds_like_the_checkpoint_backbone(run_dir, exported: Path) -> None:
    onnxruntime = pytest.importorskip("onnxruntime")
    reference = load_model(run_dir[0]).module
    batch = images(4, seed=5)
    with torch.no_grad():
        expected = reference(batch)
        for target in (exported, exported / "model.torchscript.pt", run_dir[0] / "checkpoints" / "last"):
            loaded = load_model(target, trust_torchscript=True)  # the export this test wrote
            torch.testing.assert_close(loaded.module(batch), expected, atol=1e-4, rtol=0)
    session = onnxruntime.InferenceSession(str(exported / "model.onnx"), providers=["CPUExecutionProvider"])
    (onnx_output,) = session.run(None, {"images": batch.numpy()})
    np.testing.assert_allclose(onnx_output, expected.numpy(), atol=1e-4, rtol=0)


def test_head_is_gathered_from_the_shards_with_class_names(run_dir, exported: Path) -> None:
    _, full_head = run_dir
    stored = load_file(str(exported / "head.safetensors"))["weight"]
    torch.testing.assert_close(stored, full_head, atol=0, rtol=0)
    assert json.loads((exported / "classes.json").read_text()) == [f"person{i}" for i in range(NUM_CLASSES)]
    card = json.loads((exported / "model.json").read_text())
    assert card["head"]["num_classes"] == NUM_CLASSES
    assert card["head"]["margin"] == "cosface"


def test_card_carries_the_checkpoints_training_and_evaluation(exported: Path) -> None:
    card = json.loads((exported / "model.json").read_text())
    assert card["training"]["step"] == STEP
    assert card["training"]["world_size"] == 2
    assert card["training"]["num_classes"] == NUM_CLASSES
    assert card["training"]["config"]["head"]["margin"] == "cosface"
    assert card["evaluation"]["verification"]["accuracy"] == EVALUATION["accuracy"]
    assert card["threshold"] == EVALUATION["threshold"]
    assert load_model(exported).image_size == IMAGE_SIZE


def write_pairs(root: Path) -> Path:
    """Eight people of two images each (a pattern plus noise); each makes one matched and one
    mismatched pair, two people per fold."""
    rng = np.random.default_rng(0)
    shots = []
    for person in range(8):
        base = rng.integers(0, 256, (40, 40, 3)).astype(np.int16)
        shots.append([])
        for shot in range(2):
            path = root / f"p{person}" / f"{shot}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(path), np.clip(base + rng.integers(-40, 41, base.shape), 0, 255).astype(np.uint8))
            shots[person].append(path.relative_to(root).as_posix())
    pairs = root / "pairs.csv"
    with pairs.open("w", newline="") as file:
        writer = csv.writer(file)
        for person in range(8):
            fold = person // 2
            writer.writerow([shots[person][0], shots[person][1], 1, fold])
            writer.writerow([shots[person][0], shots[(person + 3) % 8][1], 0, fold])
    return pairs


def test_eval_scores_the_export_exactly_like_its_checkpoint(run_dir, exported: Path, tmp_path: Path) -> None:
    pairs = write_pairs(tmp_path / "faces")
    reports = {}
    for name, model in (("checkpoint", run_dir[0] / "checkpoints" / "best"), ("export", exported)):
        invoke("eval", model, "--pairs", pairs, "--device", "cpu", "--out", tmp_path / name, "--quiet")
        reports[name] = json.loads((tmp_path / name / f"{report_file_name(pairs)}.json").read_text())
    assert reports["export"]["num_pairs"] == reports["checkpoint"]["num_pairs"] > 0
    assert reports["export"]["accuracy"] == reports["checkpoint"]["accuracy"]
    assert reports["export"]["threshold"] == pytest.approx(reports["checkpoint"]["threshold"], abs=1e-4)
    assert reports["export"]["auc"] == pytest.approx(reports["checkpoint"]["auc"], abs=1e-6)
    invoke(
        "export",
        exported,
        "-o",
        tmp_path / "reported",
        "--formats",
        "safetensors",
        "--quiet",
        "--evaluation",
        tmp_path / "export" / f"{report_file_name(pairs)}.json",
    )
    card = json.loads((tmp_path / "reported" / "model.json").read_text())
    assert card["threshold"] == reports["export"]["threshold"]
    assert card["evaluation"]["verification"]["accuracy"] == reports["export"]["accuracy"]
