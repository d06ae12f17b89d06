"""Shared by the fault tests: runs that are interrupted on purpose, and exact comparisons of their results."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from facetrain.checkpoint import read_entries, resolve_checkpoint, stored
from tests.support import cli_zygote
from tests.support.cli_zygote import Started
from tests.support.train_helpers import REPO, cli_env, run_cli, tiny_config

ENV = cli_env()
# The uninterrupted 2-rank run of tiny_config that stopped, killed and restarted runs end on
UNINTERRUPTED_STEPS, UNINTERRUPTED_EVERY = 12, 4


def checkpoint_tensors(path: Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint (backbone, head shards, optimizer state, RNG states), or those whose
    keys start with `prefix`, by the rest of the key."""
    checkpoint = resolve_checkpoint(path)
    keys = [key for key in stored(checkpoint) if key.startswith(prefix)]
    return {key[len(prefix) :]: value for key, value in read_entries(checkpoint, keys).items()}


def assert_same_checkpoint(actual: Path, expected: Path) -> None:
    """Bit for bit: a resumed run must end exactly where an uninterrupted one does."""
    got, want = checkpoint_tensors(actual), checkpoint_tensors(expected)
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert torch.equal(got[key], tensor), f"{key} differs after resuming"


def start(*args: str, module: str = "facetrain", **env: str) -> subprocess.Popen | Started:
    """`facetrain ARGS` (or `python -m MODULE ARGS`) in the background, `env` added to `cli_env`'s, in its
    own session so its whole process tree can be signalled: forked from warm imports where that changes
    nothing (cli_zygote), which saves the seconds of a core a fresh interpreter spends importing torch."""
    env = cli_env(**env)  # now: conftest sets variables after importing this module (TRITON_INTERPRET)
    forked = cli_zygote.start(list(args), REPO, env, module)
    if forked is not None:
        return forked
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def logged_step(run_dir: Path) -> int:
    """The last step written to metrics.csv (0 before the first)."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return 0
    try:
        with path.open() as handle:
            rows = list(csv.DictReader(handle))
        return int(rows[-1]["step"]) if rows else 0
    except (KeyError, ValueError, TypeError):  # a row, or the header itself, being written
        return 0


def wait_for_step(process: subprocess.Popen, run_dir: Path, step: int, timeout: float = 180) -> int:
    deadline = time.monotonic() + timeout
    while (reached := logged_step(run_dir)) < step:
        if process.poll() is not None:
            raise AssertionError(f"training ended before step {step}:\n{process.stderr.read()}")
        assert time.monotonic() < deadline, f"step {step} not reached within {timeout} s"
        time.sleep(0.02)
    return reached


def signal_group(process: subprocess.Popen, sig: int) -> None:
    os.killpg(process.pid, sig)


def rank_processes(launcher_pid: int) -> list[int]:
    """The rank processes a launcher (`--nproc` or torchrun) started, in start order."""
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    ranks = []
    for pid in map(int, children):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in command or b"facetrain" in command:
            ranks.append(pid)
    return sorted(ranks)


def error_lines(stderr: str) -> list[str]:
    """stderr without progress-bar output and library warnings: what the user is told."""
    lines = [line.rsplit("\r", 1)[-1] for line in stderr.splitlines()]
    return [
        line
        for line in lines
        if line.strip() and not line.startswith(("train:", "synth:", "[ WARN", "[ERROR"))
    ]


def kill_all(process: subprocess.Popen) -> None:
    if process.poll() is None:
        signal_group(process, signal.SIGKILL)
    process.communicate()


def is_weight_or_optimizer_state(key: str) -> bool:
    """What training computes from the gradients; not batch-norm's running statistics (each replica's
    own average of the batches it saw) nor the per-rank RNG streams."""
    return not key.startswith("app.rng.") and not key.endswith(
        ("running_mean", "running_var", "num_batches_tracked")
    )


def trained_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The weights and optimizer state of a checkpoint on any world size (the head's rows read whole)."""
    return {
        key: tensor for key, tensor in checkpoint_tensors(path).items() if is_weight_or_optimizer_state(key)
    }


def assert_same_weights(actual: Path, expected: Path, tolerance: float = 1e-5) -> None:
    """Equal to `tolerance` (fp32), whatever world sizes wrote them: a run that changed its world size
    sums each gradient in another order (over ranks or over micro-batches, the head's softmax over
    other class shards), which float addition does not keep bit for bit."""
    got, want = trained_tensors(actual), trained_tensors(expected)
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert torch.allclose(got[key].double(), tensor.double(), rtol=0, atol=tolerance), f"{key} differs"


def uninterrupted_two_rank_run(tmp: Path) -> Path:
    """tiny_config's UNINTERRUPTED_STEPS steps on 2 ranks (`--nproc 2`, no loader workers: where the
    samples are decoded does not change them), a checkpoint every UNINTERRUPTED_EVERY: its run folder."""
    config = tiny_config(
        tmp, "run", train={"steps": UNINTERRUPTED_STEPS}, checkpoint={"every": UNINTERRUPTED_EVERY}
    )
    result = run_cli("train", "-c", str(config), "--nproc", "2")
    assert result.returncode == 0, result.stderr
    return tmp / "run"
