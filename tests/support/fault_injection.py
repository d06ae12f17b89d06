"""Run `facetrain` in this process with a fault injected into its checkpoint writes (tests only).

    python -m tests.support.fault_injection POINT SAVE_NUMBER facetrain-arguments...

At checkpoint write number SAVE_NUMBER (1 = the first this process writes) the process is killed with
SIGKILL at POINT, or, for `disk-full`, the write fails with ENOSPC, or, for `signals`, every process of
its group (its loader workers too) gets SIGINT, SIGUSR1 and SIGTERM before and after the tensor files. The faults are wrapped around
facetrain's own functions here, so production code carries no switch for them.

Points, in the order a write passes them:
  tensors    the tensor files are written into step_N.tmp; nothing else yet
  meta       step_N.tmp is complete (meta.json too) but not yet renamed
  renamed    step_N exists, `last` still names the previous checkpoint
  pointer    `last` names step_N, older checkpoints not yet pruned
  pruning    an old checkpoint is renamed .deleting and half of its files are gone
  replacing  an existing step_N (rewritten after resuming from earlier) is moved aside, the new one
             not yet renamed in
  disk-full  writing the tensor files fails with "No space left on device"
  signals    stop signals arrive while the checkpoint is written (the process is not killed)
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import sys

import facetrain.checkpoint.writer as checkpoint_module
from facetrain.cli import main

POINTS = ("tensors", "meta", "renamed", "pointer", "pruning", "replacing", "disk-full", "signals")
STOP_SIGNALS = (signal.SIGINT, signal.SIGUSR1, signal.SIGTERM)


def die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def signal_group() -> None:
    for sig in STOP_SIGNALS:
        os.killpg(0, sig)


def inject(point: str, save_number: int) -> None:
    saves = {"count": 0}
    save_tensors, commit, prune = (
        checkpoint_module.save_entries,
        checkpoint_module._commit,
        checkpoint_module._prune,
    )
    rmtree, replace = shutil.rmtree, os.replace

    def armed() -> bool:
        return saves["count"] == save_number

    def counting_save_tensors(tensors, directory, *args, **kwargs):
        saves["count"] += 1
        if armed() and point == "disk-full":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "__0_0.distcp"))
        if armed() and point == "signals":
            signal_group()
        save_tensors(tensors, directory, *args, **kwargs)
        if armed() and point == "tensors":
            die()
        if armed() and point == "signals":
            signal_group()

    def faulty_commit(tmp, final):
        if armed() and point == "meta":
            die()
        commit(tmp, final)
        if armed() and point == "renamed":
            die()

    def faulty_prune(*args, **kwargs):
        if armed() and point == "pointer":
            die()
        prune(*args, **kwargs)

    def faulty_rmtree(path, *args, **kwargs):
        if armed() and point == "pruning" and str(path).endswith(".deleting"):
            files = sorted(p for p in os.listdir(path))
            for name in files[: len(files) // 2]:
                os.remove(os.path.join(path, name))
            die()
        rmtree(path, *args, **kwargs)

    def faulty_replace(source, target, *args, **kwargs):
        replace(source, target, *args, **kwargs)
        if armed() and point == "replacing" and str(target).endswith(".replaced"):
            die()

    checkpoint_module.save_entries = counting_save_tensors
    checkpoint_module._commit = faulty_commit
    checkpoint_module._prune = faulty_prune
    shutil.rmtree = faulty_rmtree
    os.replace = faulty_replace


if __name__ == "__main__":
    point, save_number, *arguments = sys.argv[1:]
    if point not in POINTS:
        raise SystemExit(f"unknown point {point}; one of {POINTS}")
    inject(point, int(save_number))
    sys.argv = ["facetrain", *arguments]
    main()
