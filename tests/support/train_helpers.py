"""Running `facetrain` end to end from tests: tiny synthetic configs and the CLI in a subprocess."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from tests.support import cli_zygote

REPO = Path(__file__).resolve().parents[2]


def tiny_config(tmp: Path, output: str = "run", **sections) -> Path:
    """A config that trains the small backbone on a few synthetic identities at 32x32 in seconds."""
    config = {
        "data": {
            "source": "synthetic",
            "path": str(tmp / "synth"),
            "image_size": [32, 32],
            "num_workers": 0,
            "synth": {
                "identities": 12,
                "images_per_identity": 8,
                "heldout_identities": 8,
                "heldout_images_per_identity": 4,
                "pairs_folds": 2,
                "pairs_per_fold": 10,
                "image_size": 32,
            },
        },
        "model": {"backbone": "small", "embedding_size": 32},
        "head": {"margin": "cosface", "scale": 16.0, "margin_params": {"m": 0.2}},
        "optim": {"lr": 0.05, "schedule": "constant"},
        "train": {
            "output_dir": str(tmp / output),
            "batch_size": 8,
            "steps": 6,
            "log_every": 1,
            "deterministic": True,
        },
        "checkpoint": {"every": 3},
    }
    return write_config(tmp, output, config, sections)


def write_config(tmp: Path, output: str, config: dict, sections: dict) -> Path:
    """`config` with each of `sections` merged over its section, written to tmp/OUTPUT.yaml."""
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    path = tmp / f"{output}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def trained_tiny_run(tmp: Path, steps: int, every: int = 3) -> Path:
    """`tmp` once `facetrain train` of `tiny_config(tmp, "run")` for `steps`, a checkpoint `every` so
    many, has finished: the run in tmp/run, beside it the synthetic set it trained on (module fixtures
    copy it for tests that change it)."""
    config = tiny_config(tmp, "run", train={"steps": steps}, checkpoint={"every": every})
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 0, result.stderr
    return tmp


def cli_env(**extra: str) -> dict[str, str]:
    """The environment a test's `facetrain` runs in: output unbuffered, one OpenMP thread a process (the
    suite's processes share 2 cores, and cli_zygote forks only where the thread count matches)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def run_cli(
    *args: str, timeout: float = 300, cwd: Path | None = None, module: str = "facetrain"
) -> subprocess.CompletedProcess:
    """`python -m facetrain ARGS` (or `python -m MODULE ARGS`, a test's wrapper of facetrain's main), forked
    from warm imports where that changes nothing (cli_zygote)."""
    env = cli_env()
    forked = cli_zygote.run(list(args), cwd or REPO, env, timeout, module)
    if forked is not None:
        return forked
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or REPO,
        env=env,
    )


def run_cli_at_once(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """`run_cli` of each command, all started together: for independent commands (refusals) whose
    start-up would otherwise be waited for one after another."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda command: run_cli(*command), commands))


def logged_losses(run_dir: Path) -> list[float]:
    with (run_dir / "metrics.csv").open() as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]
