"""`facetrain import insightface RUN_DIR`: arcface_torch's per-rank checkpoint_gpu_N.pt files (backbone,
Partial FC shards, SGD state, step) become one facetrain checkpoint that reshards onto any world size
and that `facetrain train --resume` continues."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from facetrain.checkpoint import load_full_head, read_entries, resolve_checkpoint
from facetrain.checkpoint.names import HEAD_STATE, HEAD_WEIGHT, OPTIM_STATE
from facetrain.checkpoint.reader import read_rows
from facetrain.errors import FacetrainError
from facetrain.heads.partition import all_class_ranges
from facetrain.interop import load_model
from facetrain.interop.insightface_run import import_insightface_run
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.train.run_config import checkpoint_config
from tests.support.train_helpers import run_cli, tiny_config

ARCH = "iresnet18"
EMBEDDING_SIZE = 16
CLASSES = 7
RANKS = 2
GLOBAL_STEP = 30


def num_local(rank: int) -> int:
    """partial_fc_v2.PartialFC_V2's num_local for `rank`."""
    return CLASSES // RANKS + int(rank < CLASSES % RANKS)


@pytest.fixture(scope="module")
def insightface_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, nn.Module, list[torch.Tensor]]:
    """What train_v2.py writes with save_all_states: per rank, the backbone, that rank's Partial FC
    `weight`, SGD over [backbone params, head weight] after a step, the scheduler and the counters."""
    run_dir = tmp_path_factory.mktemp("work_dirs") / "ms1mv3_r18"
    run_dir.mkdir()
    torch.manual_seed(0)
    initial = build_backbone(ModelConfig(backbone=ARCH, embedding_size=EMBEDDING_SIZE))
    gradients = [torch.randn_like(p) if p.requires_grad else None for p in initial.parameters()]
    heads = []
    for rank in range(RANKS):
        backbone = copy.deepcopy(initial)  # DDP: every rank steps the same backbone with the same gradient
        for parameter, gradient in zip(backbone.parameters(), gradients):
            parameter.grad = gradient
        weight = nn.Parameter(torch.normal(0, 0.01, (num_local(rank), EMBEDDING_SIZE)))
        weight.grad = torch.randn_like(weight)
        opt = torch.optim.SGD(
            [{"params": backbone.parameters()}, {"params": [weight]}], lr=0.1, momentum=0.9, weight_decay=5e-4
        )
        opt.step()
        heads.append(weight.detach().clone())
        torch.save(
            {
                "epoch": 2,
                "global_step": GLOBAL_STEP,
                "state_dict_backbone": backbone.state_dict(),
                "state_dict_softmax_fc": {"weight": weight.detach()},
                "state_optimizer": opt.state_dict(),
                "state_lr_scheduler": {"base_lrs": [0.1, 0.1], "last_epoch": GLOBAL_STEP, "warmup_steps": 0},
            },
            run_dir / f"checkpoint_gpu_{rank}.pt",
        )
    return run_dir, backbone.eval(), heads  # every rank's backbone is the same


@pytest.fixture(scope="module")
def imported(insightface_run, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "imported"
    result = run_cli("import", "insightface", str(insightface_run[0]), "-o", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    assert f"{RANKS} ranks, {CLASSES} classes, step {GLOBAL_STEP}" in result.stdout
    return out


def test_the_checkpoint_holds_backbone_head_and_counters(insightface_run, imported):
    _, backbone, heads = insightface_run
    meta = json.loads((imported / "meta.json").read_text())
    assert (meta["step"], meta["epoch"], meta["world_size"], meta["num_classes"]) == (
        GLOBAL_STEP,
        2,
        RANKS,
        CLASSES,
    )
    assert meta["imported_from"]["optimizer"] == "sgd"
    assert json.loads((imported / "classes.json").read_text()) == []  # arcface_torch keeps no names
    assert json.loads((imported / "meta.json").read_text())["num_classes"] == CLASSES
    assert torch.equal(load_full_head(imported), torch.cat(heads))
    loaded = load_model(imported).module
    config = checkpoint_config(resolve_checkpoint(imported))
    assert config.model.backbone == ARCH and config.optim.name == "sgd"
    for key, value in backbone.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_momentum_comes_along_by_parameter_and_class_range(insightface_run, imported):
    run_dir, backbone, _ = insightface_run
    for rank, (start, count) in enumerate(all_class_ranges(CLASSES, RANKS)):
        saved = torch.load(run_dir / f"checkpoint_gpu_{rank}.pt", weights_only=True)["state_optimizer"]
        head_momentum = saved["state"][saved["param_groups"][1]["params"][0]]["momentum_buffer"]
        stored = read_rows(imported, HEAD_STATE + "momentum_buffer", start, count)
        assert torch.equal(stored, head_momentum)
    saved = torch.load(run_dir / "checkpoint_gpu_0.pt", weights_only=True)["state_optimizer"]
    names = [name for name, _ in backbone.named_parameters()]
    key = f"{OPTIM_STATE}backbone.{names[0]}.momentum_buffer"
    assert torch.equal(read_entries(imported, [key])[key], saved["state"][0]["momentum_buffer"])


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_the_head_reshards_onto_any_world_size(insightface_run, imported, world_size):
    full = torch.cat(insightface_run[2])
    for start, count in all_class_ranges(CLASSES, world_size):
        assert torch.equal(read_rows(imported, HEAD_WEIGHT, start, count), full[start : start + count])


@pytest.mark.slow
def test_training_resumes_from_the_import(imported, tmp_path):
    config = tiny_config(
        tmp_path, "continued",
        data={"image_size": [112, 112], "synth": {
            "identities": CLASSES, "images_per_identity": 2, "heldout_identities": 4,
            "heldout_images_per_identity": 2, "pairs_folds": 2, "pairs_per_fold": 2, "image_size": 112,
        }},
        model={"backbone": ARCH, "embedding_size": EMBEDDING_SIZE},
        head={"margin": "arcface", "scale": 64.0, "margin_params": {"m": 0.5}},
        optim={"lr": 1e-4},
        train={"steps": GLOBAL_STEP + 1, "batch_size": 4}, checkpoint={"every": 1},
    )  # fmt: skip
    result = run_cli("train", "-c", str(config), "--resume", str(imported))
    assert result.returncode == 0, result.stderr
    assert f"resumed from {imported} at step {GLOBAL_STEP}" in result.stdout
    continued = tmp_path / "continued" / "checkpoints" / f"step_{GLOBAL_STEP + 1:08d}"
    assert json.loads((continued / "meta.json").read_text())["world_size"] == 1
    before, after = load_full_head(imported), load_full_head(continued)
    # one small step from the imported head, not a fresh one
    assert not torch.equal(before, after) and (after - before).norm() < 0.05 * before.norm()


def test_a_missing_rank_or_a_wrong_split_is_one_line(insightface_run, tmp_path):
    run_dir = insightface_run[0]
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "checkpoint_gpu_1.pt").write_bytes((run_dir / "checkpoint_gpu_1.pt").read_bytes())
    with pytest.raises(
        FacetrainError, match=r"lacks checkpoint_gpu_0\.pt: 1 checkpoint_gpu_N\.pt files are ranks 0-0, and "
    ):
        import_insightface_run(partial, None, tmp_path / "out", progress=False)
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    for rank in range(RANKS):
        source = run_dir / f"checkpoint_gpu_{RANKS - 1 - rank}.pt"
        (swapped / f"checkpoint_gpu_{rank}.pt").write_bytes(source.read_bytes())
    with pytest.raises(FacetrainError, match="Partial FC gives rank 0 of 2 4 of the 7 classes"):
        import_insightface_run(swapped, None, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "names, message",
    [
        (["0", "99999999999999999999"], r"lacks checkpoint_gpu_1\.pt: 2 checkpoint_gpu_N\.pt files are ranks 0-1, "
         r"and checkpoint_gpu_99999999999999999999\.pt is not one of them"),
        (["0", "1", "01"], r"checkpoint_gpu_01\.pt and checkpoint_gpu_1\.pt both name rank 1; keep the one"),
    ],
)  # fmt: skip
def test_rank_numbers_are_judged_against_the_files_there_are(tmp_path, names, message):
    """Round 4 (#57, high): a file naming rank 10**20 beside rank 0's had the import list every rank up
    to it, growing past 7.9 GB; now N files must be ranks 0..N-1, refused in one line before any is read
    (the files here are empty: nothing is loaded). A rank named twice (01 and 1) is refused too."""
    for name in names:
        (tmp_path / f"checkpoint_gpu_{name}.pt").write_bytes(b"")
    with pytest.raises(FacetrainError, match=message):
        import_insightface_run(tmp_path, None, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
