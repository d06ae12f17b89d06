"""Many nodes on one machine: torchrun agents on 127.0.0.1 run the commands the docs print.

Each agent is a node with one CPU rank (gloo) in its own session, so a test can take a whole node away
(the agent and its worker) with one signal. The commands are read from README.md and docs/training.md
and run with only their placeholders filled in: the endpoint, the rank count, the config, the job id.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facetrain.checkpoint import read_meta, resolve_checkpoint
from tests.support.distributed import free_port
from tests.support.fault_helpers import ENV, assert_same_weights, wait_for_step
from tests.support.train_helpers import REPO, run_cli, tiny_config

AGENT_TIMEOUT_S = 240


def doc_command(document: str, heading: str) -> tuple[dict[str, str], list[str]]:
    """The environment and argv of the first torchrun command in the bash block after `heading`."""
    text = (REPO / document).read_text().split(heading, 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = block.replace("\\\n", " ").splitlines()
    tokens = shlex.split(next(line for line in lines if "torchrun " in line))
    start = tokens.index("torchrun")
    return dict(token.split("=", 1) for token in tokens[:start]), tokens[start:]


def on_this_machine(
    documented: tuple[dict[str, str], list[str]], port: int, config: Path, job: str
) -> list[str]:
    """The documented command with its placeholders filled in for one CPU rank a node on 127.0.0.1."""
    environment, command = documented
    filled = [f"{name}={value}" for name, value in environment.items()]
    filled.append(sys.executable)
    filled += ["-m", "torch.distributed.run"]
    for token in command[1:]:
        token = token.replace("HOST:29500", f"127.0.0.1:{port}").replace("JOB", job)
        filled.append(token)
    filled[filled.index("--nproc-per-node") + 1] = "1"
    filled[filled.index("-c") + 1] = str(config)
    return ["env", *filled]


def start_node(argv: list[str], log: Path) -> subprocess.Popen:
    """One node: a torchrun agent in its own session, its output in `log`."""
    handle = log.open("w")
    return subprocess.Popen(
        argv, cwd=REPO, env=ENV, stdout=handle, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def finish(node: subprocess.Popen, timeout: float = AGENT_TIMEOUT_S) -> int:
    return node.wait(timeout=timeout)


def workers_of(agent: subprocess.Popen) -> list[int]:
    """The agent's worker processes (torchrun starts each in a session of its own)."""
    try:
        return [int(pid) for pid in Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def kill_node(agent: subprocess.Popen) -> None:
    """The whole node at once, as when it loses power: its workers, then its agent."""
    for pid in workers_of(agent):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()


def stop_all(nodes: list[subprocess.Popen]) -> None:
    for node in nodes:
        kill_node(node)


def test_the_readme_multi_node_command_is_the_one_in_the_training_docs():
    readme = doc_command("README.md", "Several nodes (run on each node):")[1]
    docs = doc_command("docs/training.md", "## Running on many nodes")[1]
    config = lambda argv: argv[argv.index("-c") + 1]  # noqa: E731
    assert [t for t in readme if t != config(readme)] == [t for t in docs if t != config(docs)]
    assert ["--nnodes", "2"] == readme[1:3] and "c10d" in readme


@pytest.mark.slow
def test_two_nodes_train_and_checkpoint_with_the_documented_command(tmp_path):
    config = tiny_config(tmp_path, "run", train={"steps": 4}, checkpoint={"every": 2})
    argv = on_this_machine(
        doc_command("README.md", "Several nodes (run on each node):"), free_port(), config, "two"
    )
    nodes = [start_node(argv, tmp_path / f"node{n}.log") for n in range(2)]
    try:
        codes = [finish(node) for node in nodes]
    finally:
        stop_all(nodes)
    if codes != [0, 0]:  # whole, as pytest would shorten an assertion's message
        pytest.fail(
            f"exit codes {codes}:\n" + "\n".join((tmp_path / f"node{n}.log").read_text() for n in range(2))
        )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["world_size"] == 2
    assert read_meta(resolve_checkpoint(tmp_path / "run"))["world_size"] == 2


def wait_for_line(logs: list[Path], text: str, nodes: list[subprocess.Popen], timeout: float = 180) -> str:
    """The first line holding `text` in any node's log; fails if it does not come or every node ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in filter(Path.exists, logs):
            found = [line for line in log.read_text().splitlines() if text in line]
            if found:
                return found[0]
        if all(node.poll() is not None for node in nodes):
            break
        time.sleep(0.2)
    raise AssertionError(
        f"no {text!r} within {timeout} s:\n" + "\n".join(log.read_text()[-3000:] for log in logs)
    )


def wait_listening(port: int, timeout: float = 60) -> None:
    """Until the first agent hosts the rendezvous store, so it is the node that must stay up."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, f"no rendezvous store on port {port} within {timeout} s"
        time.sleep(0.1)


MEMBERSHIP = re.compile(r"membership: world size (\d+) -> (\d+); resumed from step (\d+), (\d+) steps? lost")
ELASTIC, EVERY_3 = {"global_batch": 16, "steps": 100000}, {"every": 3}
# At tiny_config's lr 0.05 this 12-class set trains chaotically: the 1e-7 by which a resized step's
# gradient differs (summed in another order) grows to 1e-2 within 20 steps, and at 0.01 to 1e-3 within
# 45 as the loss nears 0. At 0.002 the run still learns (the weights move by far more than 1e-5).
QUIET = {"lr": 0.002}


@pytest.mark.slow
def test_a_job_loses_a_node_goes_on_alone_and_grows_back(tmp_path):
    """The shrink is compared with an uninterrupted run at the first checkpoint the lone rank writes;
    the whole 2 -> 1 -> 2 trajectory, at fixed steps, in the test after this one."""
    checkpoint = {**EVERY_3, "keep": 1000}
    config = tiny_config(
        tmp_path, "run", train=ELASTIC, checkpoint=checkpoint, optim=QUIET, parallel={"timeout_s": 20}
    )
    port = free_port()
    argv = on_this_machine(
        doc_command("docs/training.md", "## Preemptible clusters"), port, config, "elastic"
    )
    logs = [tmp_path / f"node{n}.log" for n in range(3)]
    nodes = [start_node(argv, logs[0])]
    try:
        wait_listening(port)
        nodes.append(start_node(argv, logs[1]))
        wait_for_step(nodes[0], tmp_path / "run", 7)
        kill_node(nodes[1])
        shrunk = MEMBERSHIP.search(wait_for_line(logs, "membership: world size 2 -> 1", nodes))
        nodes.append(start_node(argv, logs[2]))
        grown = MEMBERSHIP.search(wait_for_line(logs, "membership: world size 1 -> 2", nodes))
        wait_for_step(nodes[0], tmp_path / "run", int(grown[3]) + 2)
        os.kill(workers_of(nodes[0])[0], signal.SIGTERM)  # both ranks stop at one step, with a checkpoint
        codes = [finish(nodes[0]), finish(nodes[2])]
    finally:
        stop_all(nodes)
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    resumed = int(shrunk[3])
    assert resumed % 3 == 0 and resumed <= 9 and int(shrunk[4]) >= 7 - resumed  # the last checkpoint before
    assert int(grown[4]) == 0  # growing stops the ranks at a step, with a checkpoint first
    checkpoints = tmp_path / "run" / "checkpoints"
    alone = checkpoints / f"step_{resumed + 3:08d}"
    assert read_meta(alone)["world_size"] == 1
    last = read_meta(resolve_checkpoint(tmp_path / "run"))
    assert last["world_size"] == 2 and last["step"] > int(grown[3])
    reference = tiny_config(
        tmp_path, "reference", train={**ELASTIC, "steps": resumed + 3}, checkpoint=EVERY_3, optim=QUIET
    )
    result = run_cli("train", "-c", str(reference), "--nproc", "2", timeout=AGENT_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert_same_weights(alone, tmp_path / "reference")


@pytest.mark.slow
def test_a_run_that_goes_2_1_2_ranks_ends_with_the_weights_of_an_uninterrupted_2_rank_run(tmp_path):
    """Fixed steps (4 on 2 ranks, 4 on 1, 4 on 2) through --nproc and --resume auto, no timing involved."""
    train, checkpoint = {"global_batch": 16, "steps": 12}, {"every": 4}
    reference = tiny_config(tmp_path, "reference", train=train, checkpoint=checkpoint, optim=QUIET)
    config = tiny_config(tmp_path, "run", train=train, checkpoint=checkpoint, optim=QUIET)

    def run(*args: str) -> str:
        """`facetrain train ARGS`, forked from warm imports (run_cli): four runs, four start-ups saved."""
        result = run_cli("train", *args, timeout=AGENT_TIMEOUT_S)
        assert result.returncode == 0, result.stderr
        return result.stdout

    run("-c", str(reference), "--nproc", "2")
    run("-c", str(config), "--nproc", "2", "--set", "train.steps=4")
    lines = []
    for ranks, steps in ((1, 8), (2, 12)):
        stdout = run(
            "-c", str(config), "--nproc", str(ranks), "--resume", "auto", "--set", f"train.steps={steps}"
        )
        lines += [line for line in stdout.splitlines() if line.startswith("membership:")]
    assert lines == [
        "membership: world size 2 -> 1; resumed from step 4, 0 steps lost; 2 micro-batches a rank per step",
        "membership: world size 1 -> 2; resumed from step 8, 0 steps lost; 1 micro-batch a rank per step",
    ]
    assert_same_weights(tmp_path / "run", tmp_path / "reference")
