"""torchrun's environment on a plain `facetrain train` (#38, medium): a WORLD_SIZE without MASTER_ADDR,
a MASTER_PORT that is no port, a WORLD_SIZE of 20 digits or a RANK past it are one line before any
group is joined, where they were a ValueError, a TCPStore TypeError or 32 C++ frames."""

from __future__ import annotations

import pytest

from facetrain.errors import FacetrainError
from facetrain.parallel.dims import init_parallel
from tests.support.fault_helpers import error_lines
from tests.support.train_helpers import REPO, run_cli

LAUNCH = "start the ranks with torchrun or `facetrain train --nproc N`, or unset WORLD_SIZE to train in one process"
ENDPOINT = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531"}


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"WORLD_SIZE": "2"},
            f"environment variable WORLD_SIZE=2 asks to join a group of 2 processes, but MASTER_ADDR is not set; {LAUNCH}",
        ),
        (
            {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"},
            f"environment variable WORLD_SIZE=2 asks to join a group of 2 processes, but MASTER_PORT is not set; {LAUNCH}",
        ),
        (
            {"WORLD_SIZE": "2", **ENDPOINT, "MASTER_PORT": "abc"},
            "environment variable MASTER_PORT='abc' is not an integer",
        ),
        (
            {"WORLD_SIZE": "2", **ENDPOINT, "MASTER_PORT": "70000"},
            f"environment variable MASTER_PORT=70000 is not a port (1 to 65535); {LAUNCH}",
        ),
        (
            {"WORLD_SIZE": "99999999999999999999", **ENDPOINT},
            f"environment variable WORLD_SIZE=99999999999999999999 is more processes than 1048576; {LAUNCH}",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "5", **ENDPOINT},
            f"environment variable RANK=5 is not a rank of WORLD_SIZE=2 (0 to 1); {LAUNCH}",
        ),
        (
            {"WORLD_SIZE": "2", "RANK": "-1", **ENDPOINT},
            f"environment variable RANK=-1 is not a rank of WORLD_SIZE=2 (0 to 1); {LAUNCH}",
        ),
        ({"WORLD_SIZE": "2", "RANK": "²"}, "environment variable RANK='²' is not an integer"),
    ],
    ids=[
        "no address",
        "no port",
        "port abc",
        "port 70000",
        "20-digit world",
        "rank past the world",
        "rank -1",
        "superscript",
    ],
)
def test_a_group_that_cannot_be_joined_is_one_line_before_joining(
    monkeypatch, env: dict, message: str
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(FacetrainError) as error:
        init_parallel(backend="gloo", timeout_s=5)
    assert str(error.value) == message


def test_plain_train_with_a_rank_past_the_world_prints_one_line_and_no_frames(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "5")
    for name, value in ENDPOINT.items():
        monkeypatch.setenv(name, value)
    result = run_cli(
        "train", "-c", str(REPO / "configs" / "demo.yaml"), "-o", str(tmp_path / "run"), timeout=120
    )
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"[rank 5] error: environment variable RANK=5 is not a rank of WORLD_SIZE=2 (0 to 1); {LAUNCH}"
    ]
    assert not (tmp_path / "run").exists()
