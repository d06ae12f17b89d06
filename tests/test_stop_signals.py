"""Stop signals with DataLoader workers: the ways a scheduler stops a job, each losing nothing.

Slurm signals every process of a job; torchrun's agent stops its ranks with `killpg`, which reaches
their loader workers too; the `--nproc` launcher passes a signal on. Each test stops a 2-rank run with
2 loader workers a rank in one of those ways mid-run, then checks: every process exits (the ranks with
code 0), nothing of the run is left running, the run's log says what stopped it, and `--resume auto`
ends bit for bit where an uninterrupted run ends. The rows of the full matrix (3 signals x 4 targets x
workers 0/2 x 2 moments) are run by `tools/signal_matrix.py`; these are the ones that differ in
mechanism: the whole tree signalled under `--nproc` and under torchrun, SIGUSR1 to either launcher,
more signals during the checkpoint write (one process, its workers in its group), persistent workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from facetrain.checkpoint import find_resume_point
from tests.support.fault_helpers import (
    UNINTERRUPTED_EVERY,
    UNINTERRUPTED_STEPS,
    assert_same_checkpoint,
    error_lines,
    kill_all,
    start,
    wait_for_step,
)
from tests.support.train_helpers import run_cli, tiny_config

STEPS, EVERY = UNINTERRUPTED_STEPS, UNINTERRUPTED_EVERY  # the uninterrupted_two_ranks run's
WORKERS = {"num_workers": 2}


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (ranks, their loader workers), found through /proc."""
    found, stack = [], [pid]
    while stack:
        parent = stack.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        found += map(int, children)
        stack += map(int, children)
    return found


def signal_tree(pid: int, sig: int) -> list[int]:
    """`sig` to `pid` and every process below it, as Slurm signals every process of a job step."""
    tree = [pid, *descendants(pid)]
    for target in tree:
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            pass
    return tree


def assert_all_gone(pids: list[int], within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while alive := [pid for pid in pids if Path(f"/proc/{pid}").exists() and not _is_zombie(pid)]:
        assert time.monotonic() < deadline, f"processes left running: {alive}"
        time.sleep(0.1)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def configs(tmp: Path, **data) -> tuple[Path, Path]:
    """The config of the full run and one that would run on for ever in the same run directory (the
    learning rate is constant, so both take the same steps)."""
    data = {**WORKERS, **data}
    final = tiny_config(tmp, "run", data=data, train={"steps": STEPS}, checkpoint={"every": EVERY})
    endless = tiny_config(
        tmp,
        "endless",
        data=data,
        train={"steps": 100000, "output_dir": str(tmp / "run")},
        checkpoint={"every": EVERY},
    )
    return final, endless


def torchrun(*args: str, handled: str | None = None) -> subprocess.Popen:
    """`torchrun --standalone --nproc-per-node 2 -m facetrain ARGS` in a session of its own."""
    options = ["--standalone", "--nproc-per-node", "2"]
    if handled is not None:
        options += ["--signals-to-handle", handled]
    return start(*options, "-m", "facetrain", *args, module="torch.distributed.run")


def stop(process: subprocess.Popen, run_dir: Path, send) -> tuple[str, str, list[int]]:
    """Once step 2 is logged, `send(process)` stops the run (it returns the processes it signalled);
    the run's stdout, stderr and every process it had when stopped."""
    try:
        wait_for_step(process, run_dir, 2)
        tree = [process.pid, *descendants(process.pid)]
        send(process)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        kill_all(process)
    return stdout, stderr, tree


def stopped_step(stdout: str, sig: signal.Signals) -> int:
    line = next(line for line in stdout.splitlines() if line.startswith("stopped at step "))
    assert f" by {sig.name}; resume with: " in line
    return int(line.split()[3])


def resume_and_compare(final: Path, uninterrupted: Path, step: int) -> None:
    run = final.parent / "run"
    assert find_resume_point(run)[0].name == f"step_{step:08d}"
    log = (run / "train.log").read_text()
    assert f"stopped at step {step} by " in log
    result = run_cli("train", "-c", str(final), "--nproc", "2", "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert_same_checkpoint(run, uninterrupted)
    assert (
        f"=== facetrain train: resumed from {run / 'checkpoints' / f'step_{step:08d}'} at step {step}"
        in (run / "train.log").read_text()
    )


def test_sigterm_to_every_process_of_a_nproc_run_with_loader_workers(tmp_path, uninterrupted_two_ranks):
    final, endless = configs(tmp_path)
    process = start("train", "-c", str(endless), "--nproc", "2")
    stdout, stderr, tree = stop(process, tmp_path / "run", lambda p: signal_tree(p.pid, signal.SIGTERM))
    assert process.returncode == 0, stderr
    assert error_lines(stderr) == []
    assert_all_gone(tree)
    resume_and_compare(final, uninterrupted_two_ranks, stopped_step(stdout, signal.SIGTERM))


def test_sigterm_to_every_process_under_torchrun_stops_the_ranks_cleanly(tmp_path, uninterrupted_two_ranks):
    """torchrun's agent, given SIGTERM, stops its ranks with SIGTERM to their process groups (loader
    workers included) and then exits 1 with its own traceback; the ranks exit 0 with a checkpoint."""
    final, endless = configs(tmp_path)
    process = torchrun("train", "-c", str(endless))
    stdout, stderr, tree = stop(process, tmp_path / "run", lambda p: signal_tree(p.pid, signal.SIGTERM))
    assert "DataLoader worker" not in stderr
    assert "SignalException" in stderr  # torchrun's agent reports the signal it got
    assert_all_gone(tree)
    resume_and_compare(final, uninterrupted_two_ranks, stopped_step(stdout, signal.SIGTERM))


def test_sigusr1_to_a_torchrun_agent_that_handles_it_stops_the_ranks(tmp_path, uninterrupted_two_ranks):
    """What the Slurm scripts do: torchrun `--signals-to-handle` with SIGUSR1 passes the scheduler's
    warning on to the ranks, whose persistent loader workers ignore it."""
    final, endless = configs(tmp_path, persistent_workers=True)
    process = torchrun("train", "-c", str(endless), handled="SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    stdout, stderr, tree = stop(process, tmp_path / "run", lambda p: p.send_signal(signal.SIGUSR1))
    assert "DataLoader worker" not in stderr
    assert_all_gone(tree)
    resume_and_compare(final, uninterrupted_two_ranks, stopped_step(stdout, signal.SIGUSR1))


def test_sigusr1_to_the_nproc_launcher_with_persistent_workers(tmp_path, uninterrupted_two_ranks):
    final, endless = configs(tmp_path, persistent_workers=True)
    process = start("train", "-c", str(endless), "--nproc", "2")
    stdout, stderr, tree = stop(process, tmp_path / "run", lambda p: p.send_signal(signal.SIGUSR1))
    assert process.returncode == 0, stderr
    assert error_lines(stderr) == []
    assert_all_gone(tree)
    step = stopped_step(stdout, signal.SIGUSR1)
    assert stdout.splitlines()[-1] == (
        f"stopped at step {step} by SIGUSR1; resume with: facetrain train -c {endless} --nproc 2 --resume auto"
    )
    resume_and_compare(final, uninterrupted_two_ranks, step)


def test_signals_during_the_checkpoint_write_change_nothing(tmp_path):
    """SIGTERM to the process group stops a one-process run with loader workers; while its checkpoint
    is written, SIGINT, SIGUSR1 and SIGTERM arrive again (tests/support/fault_injection.py, `signals`): the
    checkpoint is whole, the exit code 0, and the run resumes exactly."""
    final, endless = configs(tmp_path)
    uninterrupted = tiny_config(
        tmp_path, "uninterrupted", train={"steps": STEPS}, checkpoint={"every": EVERY}
    )
    assert run_cli("train", "-c", str(uninterrupted)).returncode == 0
    endless.write_text(
        endless.read_text().replace(f"checkpoint:\n  every: {EVERY}\n", "checkpoint:\n  every: 100000\n")
    )
    process = start("signals", "1", "train", "-c", str(endless), module="tests.support.fault_injection")
    stdout, stderr, tree = stop(process, tmp_path / "run", lambda p: signal_tree(p.pid, signal.SIGTERM))
    assert process.returncode == 0, stderr
    assert error_lines(stderr) == []
    assert_all_gone(tree)
    step = stopped_step(stdout, signal.SIGTERM)
    run = tmp_path / "run"
    assert find_resume_point(run)[0].name == f"step_{step:08d}"
    result = run_cli("train", "-c", str(final), "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert_same_checkpoint(run, tmp_path / "uninterrupted")


def test_a_loader_worker_ignores_a_stop_signal_from_anyone_but_its_parent():
    """A scheduler's SIGTERM, SIGINT and SIGUSR1 leave the worker running (a worker starts with them
    blocked, so one that arrives while it starts waits for its own handling); its parent's SIGTERM
    (what Python and torch send a worker that did not shut down, at exit) still ends it at once."""
    import torch
    from torch.utils.data import DataLoader

    from facetrain.data.loader_workers import init_loader_worker, worker_context

    loader = DataLoader(
        torch.arange(64), batch_size=4, num_workers=1, worker_init_fn=init_loader_worker,
        multiprocessing_context=worker_context(), persistent_workers=True,
    )  # fmt: skip
    batches = iter(loader)
    assert next(batches).tolist() == [0, 1, 2, 3]
    worker = batches._workers[0]
    status = dict(line.split(":\t") for line in Path(f"/proc/{worker.pid}/status").read_text().splitlines())
    bit = {sig: 1 << (sig - 1) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    assert int(status["SigBlk"], 16) & bit[signal.SIGTERM]  # held for the worker's own thread
    assert int(status["SigIgn"], 16) & bit[signal.SIGINT] and int(status["SigIgn"], 16) & bit[signal.SIGUSR1]
    for sig in ("TERM", "INT", "USR1"):  # from another process, as a scheduler sends them
        subprocess.run(["kill", f"-{sig}", str(worker.pid)], check=True)
    time.sleep(0.5)
    assert worker.is_alive()
    assert next(batches).tolist() == [4, 5, 6, 7]
    os.kill(worker.pid, signal.SIGTERM)  # from its parent
    worker.join(timeout=10)
    assert worker.exitcode == 0
    batches._shutdown_workers()
