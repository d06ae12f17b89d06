"""A checkpoint's meta.json with values no run writes (#38, medium): damage named in one line, which
`--resume auto` passes over and eval, export and `--init` report, instead of ZeroDivisionError,
TypeError, or a run that says "done: 9.5 steps"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from facetrain.checkpoint.layout import find_damage, read_meta
from facetrain.checkpoint.names import BACKBONE
from facetrain.errors import FacetrainError
from facetrain.interop.insightface_import import write_imported_checkpoint
from tests.support.hostile_helpers import fake_checkpoint, one_line_error
from tests.support.small_models import EMBEDDING_SIZE, fresh_backbone, small_config

MAX = 2**53


@pytest.mark.parametrize(
    "meta, problem",
    [
        ({"step": -5}, f"its step is '-5', not a whole number from 0 to {MAX}"),
        ({"step": "abc"}, f"its step is 'abc', not a whole number from 0 to {MAX}"),
        ({"step": 4.5}, f"its step is '4.5', not a whole number from 0 to {MAX}"),
        ({"step": 1e30}, f"its step is '1e+30', not a whole number from 0 to {MAX}"),
        ({"step": True}, f"its step is 'True', not a whole number from 0 to {MAX}"),
        ({"epoch": 0}, "it has no step"),
        ({"step": 2, "world_size": 0}, f"its world_size is '0', not a whole number from 1 to {MAX}"),
        ({"step": 2, "best_accuracy": 7}, "its best_accuracy is '7', not a number from 0 to 1"),
    ],
    ids=["negative", "text", "fraction", "1e30", "bool", "no step", "no ranks", "accuracy 7"],
)
def test_meta_values_no_run_writes_are_named_damage(tmp_path: Path, meta: dict, problem: str) -> None:
    checkpoint = fake_checkpoint(tmp_path / "run", "train: {steps: 3}\n")
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    assert find_damage(checkpoint) == f"{checkpoint / 'meta.json'} is missing or unreadable ({problem})"
    with pytest.raises(FacetrainError) as error:
        read_meta(checkpoint)
    assert str(error.value) == (
        f"checkpoint {checkpoint} is damaged: {checkpoint / 'meta.json'} is missing or unreadable ({problem}); "
        "use another checkpoint"
    )


def test_the_meta_a_run_writes_passes(tmp_path: Path) -> None:
    checkpoint = fake_checkpoint(tmp_path / "run", "train: {steps: 3}\n")
    meta = {"step": 2, "epoch": 0, "consumed": 64, "best_accuracy": None, "best_step": None, "world_size": 2,
            "num_classes": 12, "embedding_size": 64, "evaluation": {}}  # fmt: skip
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    assert read_meta(checkpoint) == meta


def test_a_config_that_does_not_describe_the_weights_is_one_line_in_export(tmp_path: Path) -> None:
    """Before: the backbone built from the edited config.yaml failed load_state_dict with a traceback."""
    config = small_config()
    backbone = fresh_backbone(config)
    entries = {BACKBONE + key: value for key, value in backbone.state_dict().items()}
    checkpoint = tmp_path / "checkpoint"
    write_imported_checkpoint(entries, {"embedding_size": EMBEDDING_SIZE}, config, [], checkpoint)
    edited = (
        (checkpoint / "config.yaml")
        .read_text()
        .replace(f"embedding_size: {EMBEDDING_SIZE}", "embedding_size: 24")
    )
    (checkpoint / "config.yaml").write_text(edited)
    line = one_line_error("export", checkpoint, "-o", tmp_path / "out", "--formats", "safetensors", "--quiet")
    assert line.startswith(
        f"error: checkpoint {checkpoint} is damaged: its config.yaml builds a backbone whose "
    )
    assert line.endswith(
        "whose output.fc.weight is [24, 192], but the checkpoint holds [16, 192]; restore the config.yaml it was saved with"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint"]
