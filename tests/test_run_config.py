"""A training run holds one config object: the one the command loaded, resolved in place before the
`Trainer` (`facetrain.train.trainer.resolve_run_config`), and seen by the trainer, the saved config.yaml
and the checkpoints alike."""

from __future__ import annotations

import gc
import json
import sys

import yaml

from facetrain.train.device_defaults import native_bf16
from tests.support.train_helpers import run_cli, tiny_config


def trace_run(config: str) -> None:
    """`facetrain train -c CONFIG` in this process (a process of the test's own, `python -m` of this file),
    printing the count of Config objects alive when the loop starts and when it ends, and whether the
    trainer's config is the one the command loaded."""
    from facetrain.cli import main
    from facetrain.train import trainer
    from facetrain.train.run_config import Config

    seen = {"counts": [], "loaded_is_trained": None}
    loaded = []
    load = trainer.validate

    def remember(cfg, *args, **kwargs):
        loaded.append(cfg)
        return load(cfg, *args, **kwargs)

    fit = trainer.Trainer.fit

    def count():
        gc.collect()
        seen["counts"].append(sum(isinstance(o, Config) for o in gc.get_objects()))

    def counted_fit(self, *args):
        count()
        seen["loaded_is_trained"] = all(cfg is self.cfg for cfg in loaded)
        try:
            return fit(self, *args)
        finally:
            count()

    trainer.validate = remember
    trainer.Trainer.fit = counted_fit
    try:
        main(["train", "-c", config], standalone_mode=False)
    finally:
        print("TRACE " + json.dumps(seen))


def test_a_run_holds_one_config_object_resolved_in_place(tmp_path):
    # a global batch of 2 micro-batches, the device's pin_memory, persistent_workers and precision: all
    # resolved by the run itself
    train = {"steps": 2, "global_batch": 16, "precision": "auto"}
    config = tiny_config(tmp_path, "run", train=train, checkpoint={"every": 2})
    # forked from warm imports (cli_zygote): the objects counted are those the run makes
    result = run_cli(str(config), timeout=600, module="tests.test_run_config")
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("TRACE ")]
    seen = json.loads(line.removeprefix("TRACE "))
    assert seen == {"counts": [1, 1], "loaded_is_trained": True}
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (saved["optim"]["grad_accumulation"], saved["data"]["pin_memory"]) == (2, False)
    assert saved["data"]["persistent_workers"] is False
    assert saved["train"]["precision"] == ("bf16" if native_bf16("cpu") else "fp32")
    checkpoint = yaml.safe_load(
        (tmp_path / "run" / "checkpoints" / "step_00000002" / "config.yaml").read_text()
    )
    assert checkpoint == saved


if __name__ == "__main__":
    trace_run(sys.argv[1])
