"""The tests' forked `facetrain` (tests/support/cli_zygote.py) answers as a fresh interpreter does.

Most tests start the command line through `run_cli`, which forks it from a server that has imported the
training stack once. What those tests check holds only if the fork is the command a user runs: the
same output, exit code, working directory and environment, and a fresh interpreter wherever a fork
could differ.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import yaml

from tests.support import cli_zygote
from tests.support.train_helpers import REPO, cli_env, tiny_config


def fresh(args: list[str], cwd, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "facetrain", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_forked_command_prints_and_exits_as_a_fresh_interpreter(tmp_path):
    (tmp_path / "broken.yaml").write_text("train: {steps: -3}\n")
    plain_env = cli_env()
    rank_past_the_world = cli_env(WORLD_SIZE="2", RANK="5", MASTER_ADDR="127.0.0.1", MASTER_PORT="29999")
    demo = str(REPO / "configs" / "demo.yaml")
    commands = (
        (["--version"], plain_env),
        (["train", "--help"], plain_env),
        (["train", "-c", "broken.yaml"], plain_env),  # found through the working directory
        (["train", "-c", "missing.yaml"], plain_env),
        (["no-such-command"], plain_env),
        (
            ["train", "-c", demo, "-o", str(tmp_path / "run")],
            rank_past_the_world,
        ),  # read from the environment
    )
    for args, env in commands:
        forked = cli_zygote.run(args, tmp_path, env, timeout=120)
        assert forked is not None, "the server forks where nothing differs"
        plain = fresh(args, tmp_path, env)
        assert (forked.returncode, forked.stdout, forked.stderr) == (
            plain.returncode,
            plain.stdout,
            plain.stderr,
        )
    assert forked.returncode == 2 and "RANK=5" in forked.stderr


def test_a_forked_run_trains_and_checkpoints(tmp_path):
    config = tiny_config(tmp_path, train={"steps": 2}, checkpoint={"every": 2})
    forked = cli_zygote.run(["train", "-c", str(config)], tmp_path, cli_env(), timeout=300)
    assert forked.returncode == 0, forked.stderr
    assert [path.name for path in (tmp_path / "run" / "checkpoints").glob("step_*")] == ["step_00000002"]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"]["steps"] == 2


def test_a_variable_read_at_start_that_differs_means_a_fresh_interpreter(tmp_path):
    assert cli_zygote.run(["--version"], tmp_path, cli_env(), timeout=120) is not None
    for name in ("OMP_NUM_THREADS", "PYTHONHASHSEED", "TORCH_LOGS", "TRITON_INTERPRET"):
        changed = cli_env(**{name: "7" if name != "TORCH_LOGS" else "+dynamo"})
        assert cli_zygote.run(["--version"], tmp_path, changed, timeout=120) is None, name


def test_a_forked_command_past_its_timeout_is_killed(tmp_path):
    config = tiny_config(tmp_path, train={"steps": 100_000}, checkpoint={"every": 100_000})
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        cli_zygote.run(["train", "-c", str(config)], REPO, cli_env(), timeout=5)
    assert time.monotonic() - started < 60
