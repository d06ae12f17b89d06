"""The stop-signal matrix: every way a scheduler or a user stops a run, each checked to lose nothing.

    python tools/signal_matrix.py --out runs/signal_matrix            # the full matrix, ~30 min on 2 cores
    python tools/signal_matrix.py --signals SIGTERM --targets group --workers 2 --moments step

A row stops a tiny 2-rank run (the small backbone, synthetic faces at 32x32, `deterministic: true`)
with one signal sent to one target at one moment, then resumes it with `--resume auto` to its last
step, and checks what docs/cluster.md promises: every process of the run gone within the time limit,
no process left, the run's lock free, a checkpoint at the step the run stopped at (0 steps lost), and
the resumed run's final checkpoint equal bit for bit to an uninterrupted run's (every tensor:
weights, head shards, optimizer state, RNG states).

Targets:
  rank      rank 0's process only, under `facetrain train --nproc 2` (the ranks agree and all stop)
  launcher  the `--nproc` launcher only (it passes the signal on)
  agent     a torchrun agent only (`torchrun --standalone --nproc-per-node 2`, its default signal
            handling: SIGTERM and SIGINT stop its ranks with SIGTERM; SIGUSR1 kills the agent, and the
            ranks, watching it, stop by themselves)
  group     every process of a `--nproc` run at once (launcher, ranks, loader workers): what Slurm does

Moments: `step` (after step 2 is logged), `checkpoint` (as soon as the checkpoint of step 2 is being
written, `step_00000002.tmp` seen), `startup` (1 s after the command starts, before any step; to a
rank, as soon as it exists). At start-up nothing has been trained: a process may still be starting
Python and end at once, or stop before its first step; the row passes when nothing is left running and
the run, started again with `--resume auto`, ends bit for bit where an uninterrupted run ends.

The table (markdown) goes to OUT/matrix.md and every row to OUT/rows.jsonl; the exit status is 1 when
any row failed.
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from facetrain.checkpoint import read_entries, resolve_checkpoint, stored  # noqa: E402
from tools.run_processes import alive, logged_step, tree  # noqa: E402

STEPS = 6
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
TARGETS = ("rank", "launcher", "agent", "group")
MOMENTS = ("step", "checkpoint", "startup")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def write_config(folder: Path, name: str, run: Path, workers: int, steps: int) -> Path:
    config = {
        "data": {
            "source": "synthetic",
            "path": str(folder / "synth"),
            "image_size": [32, 32],
            "num_workers": workers,
            "synth": {
                "identities": 12, "images_per_identity": 8, "heldout_identities": 8,
                "heldout_images_per_identity": 4, "pairs_folds": 2, "pairs_per_fold": 10, "image_size": 32,
            },
        },
        "model": {"backbone": "small", "embedding_size": 32},
        "head": {"margin": "cosface", "scale": 16.0, "margin_params": {"m": 0.2}},
        "optim": {"lr": 0.05, "schedule": "constant"},  # constant: the endless run takes the same steps
        "train": {
            "output_dir": str(run), "batch_size": 8, "steps": steps, "log_every": 1, "deterministic": True,
        },
        "checkpoint": {"every": 2},
    }  # fmt: skip
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def command(target: str, config: Path) -> list[str]:
    if target == "agent":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        return [*launcher, "-m", "facetrain", "train", "-c", str(config)]
    return [sys.executable, "-m", "facetrain", "train", "-c", str(config), "--nproc", "2"]


def rank_zero(launcher: int, deadline: float) -> int:
    """Rank 0's process, once the launcher has started it."""
    while time.monotonic() < deadline:
        children = [int(c) for c in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()]
        ranks = [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        if ranks:
            return min(ranks)
        time.sleep(0.01)
    raise SystemExit("the launcher started no rank within its time")


def wait_for_moment(process: subprocess.Popen, run: Path, moment: str, deadline: float) -> bool:
    """Wait for the moment; True when it came before the process ended."""
    if moment == "startup":
        time.sleep(1.0)
        return process.poll() is None
    while process.poll() is None and time.monotonic() < deadline:
        if moment == "step" and logged_step(run) >= 2:
            return True
        if moment == "checkpoint" and (run / "checkpoints" / "step_00000002.tmp").exists():
            return True
        time.sleep(0.002)
    return False


def send(process: subprocess.Popen, target: str, sig: signal.Signals) -> list[int]:
    """Send `sig` to the target; returns every process of the run at that moment."""
    processes = tree(process.pid)
    if target == "rank":
        os.kill(rank_zero(process.pid, time.monotonic() + 120), sig)
    elif target == "group":
        for pid in processes:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    else:
        os.kill(process.pid, sig)
    return processes


def lock_is_free(run: Path) -> bool:
    path = run / ".facetrain-lock"
    if not path.exists():
        return True
    with path.open() as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def tensors(run: Path) -> dict[str, torch.Tensor]:
    checkpoint = resolve_checkpoint(run)
    return read_entries(checkpoint, list(stored(checkpoint)))


def same_tensors(got: dict, want: dict) -> bool:
    return sorted(got) == sorted(want) and all(torch.equal(got[key], want[key]) for key in want)


def run_row(folder: Path, reference: dict, sig_name: str, target: str, workers: int, moment: str) -> dict:
    row = {"signal": sig_name, "target": target, "workers": workers, "moment": moment}
    run = folder / "run"
    shutil.rmtree(run, ignore_errors=True)
    endless = write_config(folder, "endless", run, workers, 100000)
    final = write_config(folder, "final", run, workers, STEPS)
    process = subprocess.Popen(
        command(target, endless), cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        row["moment_reached"] = wait_for_moment(process, run, moment, time.monotonic() + 180)
        sent = time.monotonic()
        processes = send(process, target, signal.Signals[sig_name]) if row["moment_reached"] else []
        stdout, stderr = process.communicate(timeout=180)
        row["exit_s"] = round(time.monotonic() - sent, 2)
    except subprocess.TimeoutExpired:
        row["exit_s"] = None
        stdout = stderr = ""
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    row["exit_code"] = process.returncode
    deadline = time.monotonic() + 15
    while (left := [pid for pid in processes if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    row["left"] = len(left)
    row["lock_free"] = lock_is_free(run)
    stopped = [line for line in stdout.splitlines() if line.startswith("stopped at step ")]
    row["stopped_at"] = int(stopped[0].split()[3]) if stopped else None
    row["tracebacks"] = stderr.count("Traceback (most recent call last)")
    try:
        summary = json.loads((run / "summary.json").read_text())
        row["stop_to_checkpoint_s"] = summary.get("stop_to_checkpoint_s")
    except (OSError, ValueError):
        row["stop_to_checkpoint_s"] = None
    saved = resolve_checkpoint(run).name if (run / "checkpoints" / "last").exists() else None
    expected = None if not row["stopped_at"] else f"step_{row['stopped_at']:08d}"
    row["steps_lost"] = 0 if saved == expected else (row["stopped_at"] or 0)
    resumed = subprocess.run(
        [*command("launcher", final), "--resume", "auto"], cwd=REPO, env=ENV, capture_output=True, text=True
    )
    row["bit_exact"] = resumed.returncode == 0 and same_tensors(tensors(run), reference)
    # at start-up nothing was trained: the run may end before its handlers are in (killed by the
    # signal) or stop before its first step; either way a restart must reach the same end
    stopped = row["stopped_at"] is not None or moment == "startup"
    row["passed"] = bool(
        row["moment_reached"] and stopped and row["steps_lost"] == 0 and row["left"] == 0 and row["lock_free"]
        and row["bit_exact"] and row["exit_s"] is not None
    )  # fmt: skip
    return row


TABLE_HEADER = (
    "| signal | target | workers | moment | exit code | exit (s) | stopped at | steps lost | left | lock free "
    "| bit-exact | result |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def table_line(row: dict) -> str:
    cells = [
        row["signal"], row["target"], row["workers"], row["moment"], row["exit_code"], row["exit_s"],
        row["stopped_at"], row["steps_lost"], row["left"], "yes" if row["lock_free"] else "no",
        "yes" if row["bit_exact"] else "no", "pass" if row["passed"] else "FAIL",
    ]  # fmt: skip
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/signal_matrix"))
    parser.add_argument("--signals", default=",".join(SIGNALS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--workers", default="0,2")
    parser.add_argument("--moments", default="step,checkpoint")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    reference_run = args.out / "reference"
    if not (reference_run / "checkpoints" / "last").exists():
        shutil.rmtree(reference_run, ignore_errors=True)
        config = write_config(args.out, "reference", reference_run, 0, STEPS)
        subprocess.run(command("launcher", config), cwd=REPO, env=ENV, check=True, capture_output=True)
    reference = tensors(reference_run)
    rows_path = args.out / "rows.jsonl"
    rows = []
    combos = itertools.product(
        args.signals.split(","),
        args.targets.split(","),
        map(int, args.workers.split(",")),
        args.moments.split(","),
    )
    print(TABLE_HEADER, flush=True)
    for sig_name, target, workers, moment in combos:
        started = time.monotonic()
        row = run_row(args.out, reference, sig_name, target, workers, moment)
        row["row_s"] = round(time.monotonic() - started, 1)
        rows.append(row)
        with rows_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(table_line(row), flush=True)
    passed = sum(row["passed"] for row in rows)
    summary = f"{passed} of {len(rows)} rows passed"
    (args.out / "matrix.md").write_text("\n".join([TABLE_HEADER, *map(table_line, rows), "", summary, ""]))
    print(summary)
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
