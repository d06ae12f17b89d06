"""A one-node Slurm cluster of the test's own: munged, slurmctld and slurmd in a temporary folder.

The daemons run in the foreground as children of the test, on free ports, with every state, spool,
pid, log and socket file in the folder, so a test never touches (or needs) a system-wide Slurm or
munge, and teardown stops each daemon by its process id. Slurm's daemons need root (SlurmUser=root,
slurmd starts jobs as their user): without root or without the binaries the test is skipped, with
the reason, never passed. `.ci/run` installs them (Debian: slurm-wlm, munge).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
# How long slurmd gives a job's processes between SIGTERM and SIGKILL when Slurm ends a job (a
# requeue, scancel, the time limit): long enough for a tiny run's ranks to finish their step and write
# the checkpoint under load on 2 cores, short enough that a test is not held up by a stuck process.
KILL_WAIT_S = 15
# The job credential's lifetime (AuthInfo's cred_expire, 120 s by default): Slurm holds a requeued job
# this long plus a second before it may start again.
CRED_EXPIRE_S = 5


@dataclass
class SlurmCluster:
    """What a test needs to use the cluster: the environment for client commands and where things are."""

    root: Path
    env: dict[str, str]
    node: str

    def run(self, *command: str, check: bool = True) -> str:
        """A client command (sbatch, scontrol, ...) against this cluster; its stdout."""
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job`'s fields (JobState, Restarts, ...), or {} once Slurm has forgotten the job."""
        result = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id], env=self.env, capture_output=True, text=True
        )
        return dict(field.split("=", 1) for field in result.stdout.split() if "=" in field)


def free_ports(count: int) -> list[int]:
    """Ports nobody listens on now (all held open together, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    for each in sockets:
        each.bind(("", 0))
    ports = [each.getsockname()[1] for each in sockets]
    for each in sockets:
        each.close()
    return ports


def slurm_conf(root: Path, node: str, cpus: int) -> str:
    controller_port, node_port = free_ports(2)
    return f"""\
ClusterName=facetrain-test
SlurmctldHost={node}
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket,cred_expire={CRED_EXPIRE_S}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# the main scheduling loop every second (60 s by default), so a requeued job starts once it may
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
KillWait={KILL_WAIT_S}
ReturnToService=2
NodeName={node} CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def skip_reason() -> str | None:
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]
    if missing:
        return f"Slurm/munge not installed (missing {', '.join(missing)}; Debian: slurm-wlm munge)"
    if os.geteuid() != 0:
        return "a test Slurm cluster needs root (SlurmUser=root, slurmd runs jobs as their user)"
    return None


def start_munge(root: Path) -> subprocess.Popen:
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    os.chown(key, 0, 0)
    return start_daemon(
        root,
        "munged",
        "--foreground",
        "--force",
        f"--socket={root}/munge.socket",
        f"--key-file={key}",
        f"--pid-file={root}/munged.pid",
        f"--log-file={root}/munged.log",
        f"--seed-file={root}/munged.seed",
    )


def start_daemon(root: Path, *command: str) -> subprocess.Popen:
    """A daemon in the foreground, its own output in root/NAME.out."""
    with (root / f"{command[0]}.out").open("w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_until(ready, what: str, processes: list[subprocess.Popen], root: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for process in processes:
            if process.poll() is not None:
                log = (root / f"{process.args[0]}.out").read_text()[-2000:]
                raise AssertionError(f"{process.args[0]} exited with {process.returncode}:\n{log}")
        assert time.monotonic() < deadline, f"{what} not within {timeout} s (logs in {root})"
        time.sleep(0.2)


def job_processes(root: Path) -> list[int]:
    """Processes of jobs: slurmstepd and everything a job started carry our SLURM_CONF in their
    environment (slurmd sets it), the daemons themselves do not."""
    found = []
    marker = f"SLURM_CONF={root}/slurm.conf".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found


def stop(processes: list[subprocess.Popen], root: Path) -> None:
    """Each daemon by its pid, the node daemon first; then SIGKILL to whatever a job left behind."""
    for process in reversed(processes):
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    for pid in job_processes(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory) -> Iterator[SlurmCluster]:
    """munged, slurmctld and slurmd of this module's own, the node idle; all stopped afterwards."""
    if reason := skip_reason():
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    (root / "state").mkdir()
    (root / "spool").mkdir()
    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, node, os.cpu_count() or 1))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root, env, node)
    processes = [start_munge(root)]
    try:
        wait_until((root / "munge.socket").exists, "munged's socket", processes, root)
        processes.append(start_daemon(root, "slurmctld", "-D", "-f", str(conf)))
        processes.append(start_daemon(root, "slurmd", "-D", "-f", str(conf)))
        wait_until(
            lambda: cluster.run("sinfo", "-h", "-o", "%t", check=False).strip() == "idle",
            "the node idle in sinfo",
            processes,
            root,
        )
        yield cluster
    finally:
        stop(processes, root)
