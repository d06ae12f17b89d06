"""A setting that moved to another section is still read under its former key (the checkpoint settings
left `train` for `checkpoint` in #59): from a config file, `--set` and a checkpoint's saved config.yaml,
with one line naming the new key; both keys given with different values is a one-line error."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.config.former_keys import former_keys
from facetrain.errors import FacetrainError
from facetrain.train.run_config import Config, checkpoint_config, load_config

MOVED = {
    "train.checkpoint_every": "checkpoint.every",
    "train.checkpoint_every_minutes": "checkpoint.every_minutes",
    "train.keep_checkpoints": "checkpoint.keep",
}


def notices(capsys) -> list[str]:
    captured = capsys.readouterr()
    return [line for line in (captured.out + captured.err).splitlines() if "read as such" in line]


def test_the_checkpoint_section_declares_its_former_keys():
    assert former_keys(Config) == MOVED


def test_a_config_file_with_the_former_keys_reads_them_as_the_new_ones(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    settings = {"checkpoint_every": 7, "checkpoint_every_minutes": 2.5, "keep_checkpoints": 4}
    path.write_text(yaml.safe_dump({"train": {"steps": 9, **settings}}))
    cfg = load_config(path)
    assert (cfg.checkpoint.every, cfg.checkpoint.every_minutes, cfg.checkpoint.keep) == (7, 2.5, 4)
    assert cfg.train.steps == 9
    assert notices(capsys) == [
        f"config {path}: {old} is now {new}; read as such" for old, new in MOVED.items()
    ]


def test_set_with_a_former_key_says_so_once_and_a_same_value_beside_the_new_key_is_fine(capsys):
    cfg = load_config(None, ["train.keep_checkpoints=5"])
    assert cfg.checkpoint.keep == 5
    assert notices(capsys) == ["--set: train.keep_checkpoints is now checkpoint.keep; read as such"]
    assert load_config(None, ["checkpoint.keep=5", "train.keep_checkpoints=5"]).checkpoint.keep == 5


def test_both_keys_with_different_values_is_one_line(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump({"train": {"checkpoint_every": 100}, "checkpoint": {"every": 200}}))
    with pytest.raises(FacetrainError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"config {path}: train.checkpoint_every = 100 and checkpoint.every = 200 are one setting, "
        "checkpoint.every now; give it once, as checkpoint.every"
    )
    assert "\n" not in str(caught.value)


def test_a_checkpoint_saved_with_the_former_keys_reads_its_config(tmp_path, capsys):
    checkpoint = tmp_path / "step_00000004"
    checkpoint.mkdir()
    saved = {"train": {"keep_checkpoints": 2, "checkpoint_every": 4}}
    (checkpoint / "config.yaml").write_text(yaml.safe_dump(saved))
    cfg = checkpoint_config(checkpoint)
    assert (cfg.checkpoint.every, cfg.checkpoint.keep) == (4, 2)
    source = checkpoint / "config.yaml"
    assert notices(capsys) == [
        f"config {source}: train.checkpoint_every is now checkpoint.every; read as such",
        f"config {source}: train.keep_checkpoints is now checkpoint.keep; read as such",
    ]


def test_facetrain_config_prints_the_checkpoint_section_and_the_notice_apart():
    result = CliRunner().invoke(main, ["config", "--set", "train.checkpoint_every=50"])
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.stdout)
    assert printed["checkpoint"] == {"every": 50, "every_minutes": None, "keep": 3}
    assert "checkpoint_every" not in printed["train"]
    assert result.stderr.strip() == "--set: train.checkpoint_every is now checkpoint.every; read as such"
