"""A run made before the `checkpoint` config section (#59) resumes bit for bit.

Before #59 the checkpoint settings were `train.checkpoint_every`, `train.checkpoint_every_minutes` and
`train.keep_checkpoints`, and every config.yaml a run saved (the run folder's, each checkpoint's) said
so; the tensors, meta.json and classes.json are written as they were. The old run here is built from
those documented keys: a run whose config file, run-folder config.yaml and checkpoint config.yaml are
rewritten to the old layout, resumed with that run-folder config.yaml as its config. It ends with
exactly the tensors of an uninterrupted run (weights, head, optimizer state, weight average, RNG
streams), each old key read with one line naming its new one. In-process: two short runs and a resume.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from facetrain.checkpoint.run_dir import RUN_CONFIG_HEADER
from facetrain.train.run_config import load_config
from facetrain.train.trainer import train
from tests.support.fault_helpers import assert_same_checkpoint
from tests.support.train_helpers import tiny_config

STEPS, EVERY = 4, 2
# in-process: no tracker to import, and no process-wide deterministic switch left behind for other tests
RUN = {"model": {"ema_decay": 0.9}, "checkpoint": {"every": EVERY, "keep": 1}}
TRAIN = {"deterministic": False, "trackers": []}
MOVED = {"every": "checkpoint_every", "every_minutes": "checkpoint_every_minutes", "keep": "keep_checkpoints"}


def to_old_layout(path: Path, header: str = "") -> None:
    """Rewrite the config at `path` as facetrain wrote it before #59: the checkpoint settings in train."""
    config = yaml.safe_load(path.read_text())
    settings = config.pop("checkpoint")
    config["train"].update({old: settings[new] for new, old in MOVED.items() if new in settings})
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))


def test_a_run_saved_with_the_train_checkpoint_keys_resumes_bit_for_bit(tmp_path, capsys):
    straight = tiny_config(tmp_path, "straight", train={**TRAIN, "steps": STEPS}, **RUN)
    old = tiny_config(tmp_path, "old", train={**TRAIN, "steps": EVERY}, **RUN)
    to_old_layout(old)
    assert train(load_config(old))["steps"] == EVERY
    run = tmp_path / "old"
    to_old_layout(run / "config.yaml", RUN_CONFIG_HEADER)
    saved = run / "checkpoints" / f"step_{EVERY:08d}" / "config.yaml"
    to_old_layout(saved)
    capsys.readouterr()

    resumed = train(load_config(run / "config.yaml", [f"train.steps={STEPS}"]), resume="auto")
    output = capsys.readouterr()
    assert resumed["steps"] == STEPS
    lines = (output.out + output.err).splitlines()
    for source in (run / "config.yaml", saved):  # the config given, and the checkpoint's own
        for new, old in MOVED.items():
            notice = f"config {source}: train.{old} is now checkpoint.{new}; read as such"
            assert lines.count(notice) == 1, (notice, lines)
    assert train(load_config(straight))["steps"] == STEPS
    assert sorted(path.name for path in (run / "checkpoints").glob("step_*")) == [f"step_{STEPS:08d}"]
    assert_same_checkpoint(run, tmp_path / "straight")
