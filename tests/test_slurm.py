"""`facetrain slurm-script`'s train.sbatch on a real one-node Slurm (tests/support/slurm_cluster.py): requeued from outside,
stopped by its time-limit warning and requeued by itself, it ends bit for bit where an uninterrupted
run ends, leaves no process behind, and its output and train.log say what happened. And
train_multinode.sbatch, on a one-node allocation.

The time-limit path is the real one: the job runs with the script's own `--signal=B:USR1@120`, and
once it trains again after the first requeue the test shortens its time limit to 2 minutes (what an
admin's `scontrol update` does), so the controller's next time-limit check sends the warning. That
check comes every 30 s (slurmctld's PERIODIC_TIMEOUT, compiled in: no slurm.conf setting shortens
it), so until the warning is in the job's output the test holds the job's ranks and loader workers
with SIGSTOP: the batch shell, srun and torchrun's agent take the warning as they would, the signals
they pass on wait in the held ranks, which take them on SIGCONT. The job need not train through the
wait (it took 1,000 steps beside the reference run, 275 s of the suite). While the job waits to start
again the test gives it 10 minutes, so the last start finishes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facetrain.data import prepare_train_data
from facetrain.train.run_config import load_config
from tests.support.fault_helpers import ENV, assert_same_checkpoint, logged_step
from tests.support.slurm_cluster import SlurmCluster, job_processes, slurm_cluster  # noqa: F401 (a fixture)
from tests.support.train_helpers import run_cli, tiny_config

pytestmark = pytest.mark.slow

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
# enough that the job is still training when the test holds it in its second start (2 ranks take up
# to ~15 steps a second here; the first start stops a few steps after step 3, the second a few steps
# after the first stop), two epochs of SYNTH, and few enough that the last start is short
STEPS = 48
JOB_NAME = "slurmtest"
# tiny_config's set with 4 times the images: 24 steps an epoch, fewer loader starts
SYNTH = {
    "identities": 12,
    "images_per_identity": 32,
    "heldout_identities": 8,
    "heldout_images_per_identity": 4,
    "pairs_folds": 2,
    "pairs_per_fold": 10,
    "image_size": 32,
}


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.05)


def written_script(folder: Path, *options: str) -> str:
    """`facetrain slurm-script OPTIONS > NAME.sbatch` in `folder`, as a user writes it: the name."""
    name = "train_multinode.sbatch" if options else "train.sbatch"
    printed = run_cli("slurm-script", *options)
    assert printed.returncode == 0, printed.stderr
    (folder / name).write_text(printed.stdout)
    return name


def submit(cluster: SlurmCluster, folder: Path, *arguments: str) -> str:
    """`sbatch ARGUMENTS` as a user types it in `folder` (options, a script, facetrain's arguments),
    with this venv's torchrun on PATH; the job's id."""
    env = {**cluster.env, **ENV, "PATH": f"{Path(TORCHRUN).parent}:{cluster.env['PATH']}"}
    options = ["--parsable", f"--job-name={JOB_NAME}", "--cpus-per-task=2", "--time=10"]
    result = subprocess.run(
        ["sbatch", *options, *arguments], cwd=folder, env=env, capture_output=True, text=True, check=True
    )
    return result.stdout.strip().split(";")[0]


def requeued(cluster: SlurmCluster, job_id: str, restarts: int) -> bool:
    """Whether the job waits to start for the `restarts`th time (its last start has ended)."""
    job = cluster.job(job_id)
    assert job.get("JobState") != "COMPLETED", "the job finished first: STEPS too few for this machine"
    return job.get("Restarts") == str(restarts) and job.get("JobState") == "PENDING"


def started_again(cluster: SlurmCluster, job_id: str, restarts: int, run_dir: Path, after_step: int):
    """Whether the job's start number `restarts` runs and has trained beyond `after_step`."""
    job = cluster.job(job_id)
    running = job.get("Restarts") == str(restarts) and job.get("JobState") == "RUNNING"
    return running and logged_step(run_dir) > after_step


def training_processes(cluster: SlurmCluster) -> list[int]:
    """The job's ranks and their loader workers: every process below torchrun's agent."""
    found, parents = [], [pid for pid in job_processes(cluster.root) if _is_torchrun(pid)]
    while parents:
        children = []
        for parent in parents:
            try:
                children += map(int, Path(f"/proc/{parent}/task/{parent}/children").read_text().split())
            except OSError:  # gone meanwhile
                continue
        found += children
        parents = children
    return found


def _is_torchrun(pid: int) -> bool:
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile
        return False
    return len(arguments) > 1 and arguments[1].endswith(b"/torchrun")


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def assert_no_job_process_left(cluster: SlurmCluster) -> None:
    """Nothing of the job runs once it has ended (torchrun, ranks, loader workers, slurmstepd), given
    a few seconds for slurmstepd to go."""
    deadline = time.monotonic() + 30
    while (left := job_processes(cluster.root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    commands = []
    for pid in left:
        try:
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone meanwhile
            continue
    assert commands == []


def test_a_requeued_and_time_limited_job_ends_exactly_like_an_uninterrupted_run(
    slurm_cluster,  # noqa: F811 (the fixture imported above)
    tmp_path,
):
    data = {"num_workers": 2, "synth": SYNTH}
    config = tiny_config(
        tmp_path, "reference", data=data, train={"steps": STEPS}, checkpoint={"every": STEPS}
    )
    prepare_train_data(load_config(config).data)  # once, before two runs read it
    command = ["--standalone", "--nproc-per-node", "2", "-m", "facetrain", "train", "-c", str(config), "-q"]
    reference = subprocess.Popen(
        [TORCHRUN, *command],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        check_the_job(slurm_cluster, tmp_path, config, reference)
    finally:
        if reference.poll() is None:
            os.killpg(reference.pid, signal.SIGKILL)


def check_the_job(cluster: SlurmCluster, tmp_path: Path, config: Path, reference: subprocess.Popen) -> None:
    job_id = submit(cluster, tmp_path, written_script(tmp_path), "-c", str(config), "-q")
    run_dir = tmp_path / "runs" / f"{JOB_NAME}-{job_id}"

    wait_for(lambda: logged_step(run_dir) >= 3, "the job's first steps")
    cluster.run("scontrol", "requeue", job_id)
    wait_for(lambda: requeued(cluster, job_id, 1), "the requeue")
    stopped = logged_step(run_dir)
    wait_for(lambda: started_again(cluster, job_id, 1, run_dir, stopped), "the first restart training")
    held = training_processes(cluster)
    assert held, "no ranks below torchrun's agent"
    signal_all(held, signal.SIGSTOP)
    try:
        cluster.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=2")
        out = tmp_path / f"{JOB_NAME}-{job_id}.out"
        wait_for(lambda: "train.sbatch: USR1" in out.read_text(), "the time-limit warning", 60)
    finally:
        signal_all(held, signal.SIGCONT)
    wait_for(lambda: requeued(cluster, job_id, 2), "the time-limit requeue", 90)
    cluster.run("scontrol", "update", f"JobId={job_id}", "TimeLimit=10")
    wait_for(lambda: cluster.job(job_id).get("JobState") == "COMPLETED", "the job's end", 180)

    assert reference.wait(timeout=120) == 0, reference.stderr.read()[-3000:]
    assert_same_checkpoint(run_dir, tmp_path / "reference")
    assert_no_job_process_left(cluster)
    output = (tmp_path / f"{JOB_NAME}-{job_id}.out").read_text()
    assert "train.sbatch: TERM" in output  # the requeue from outside
    assert "train.sbatch: USR1" in output and f"requeueing job {job_id}" in output  # the time limit
    stops = [int(step) for step in re.findall(r"stopped at step (\d+) by SIGTERM", output)]
    resumes = [int(step) for step in re.findall(r"resumed from \S+ at step (\d+)", output)]
    assert len(stops) == 2 and resumes == stops, output  # each stop checkpointed its last step
    assert [f"train.sbatch: job {job_id} (restart {n})" in output for n in range(3)] == [True] * 3
    headers = [line for line in (run_dir / "train.log").read_text().splitlines() if " === " in line]
    assert [f"Slurm job {job_id} (restart {n})" in line for n, line in enumerate(headers)] == [True] * 3
    assert ["resumed from" in line for line in headers] == [False, True, True]
    checkpoints = sorted((run_dir / "checkpoints").glob("step_*"))
    assert [int(path.name.split("_")[1]) for path in checkpoints] == [*stops, STEPS]
    assert {json.loads((path / "meta.json").read_text())["slurm_job_id"] for path in checkpoints} == {job_id}


def test_the_several_node_script_trains_on_a_one_node_allocation(slurm_cluster, tmp_path):  # noqa: F811
    """train_multinode.sbatch's c10d rendezvous on the allocation's first node, its arguments and its
    run directory; several physical nodes are not tested (docs/cluster.md)."""
    config = tiny_config(tmp_path, "run", data={"num_workers": 2})
    job_id = submit(
        slurm_cluster,
        tmp_path,
        "--nodes=1",
        written_script(tmp_path, "--nodes", "2"),
        "-c",
        str(config),
        "-o",
        "mine",
        "-q",
    )
    wait_for(lambda: slurm_cluster.job(job_id).get("JobState") == "COMPLETED", "the job's end", 120)
    output = (tmp_path / f"{JOB_NAME}-{job_id}.out").read_text()
    node = slurm_cluster.node
    assert f"on 1 nodes ({node}), 2 ranks each, rendezvous {node}:" in output, output
    assert "done: 6 steps" in output
    assert (tmp_path / "mine" / "checkpoints" / "step_00000006" / "meta.json").is_file()
    assert not (tmp_path / "runs").exists()
    assert_no_job_process_left(slurm_cluster)
