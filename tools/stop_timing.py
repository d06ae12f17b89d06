"""How long a stop takes: from a stop signal to the checkpoint committed, and to the last process gone.

    python tools/stop_timing.py --out runs/stop_timing                 # both cases, ~10 min on 2 cores
    python tools/stop_timing.py --cases demo --repeats 3

Each case trains with `facetrain train --nproc 2`, sends SIGTERM to every process of the run (as Slurm
does at preemption, at the time limit and at `scancel`) once step `--after` is logged, and reads:
  - signal -> checkpoint: rank 0's own measure (`stop_to_checkpoint_s` in the run's summary.json): the
    rest of the step under way, the ranks' agreement, and the checkpoint written and committed;
  - signal -> exit: until the launcher and every rank and loader worker have exited.
The second bounds the lead time a scheduler's warning needs (`#SBATCH --signal=B:USR1@SECONDS`) and
must stay inside Slurm's KillWait (30 s by default) for a stop at the time limit itself.

Cases:
  demo    configs/demo.yaml as `make demo` runs it (the small backbone at 112x112, 2 ranks; no verification)
  head1m  a C = 1,000,000-class tiled head, D = 512, fp32 with SGD momentum: 2 GiB of weights and 2 GiB
          of optimizer state, half a rank, written into the checkpoint (a list file of 1M identities over
          a few tiny images: the head, not the images, is what is measured)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.run_processes import alive, logged_step, tree  # noqa: E402

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def demo_args(out: Path) -> list[str]:
    return [
        "-c",
        str(REPO / "configs/demo.yaml"),
        "--set",
        f"data.path={out / 'synth'}",
        "--set",
        "eval.pairs=null",
    ]


def head_1m_args(out: Path, classes: int = 1_000_000) -> list[str]:
    listing = out / "identities_1m.csv"
    if not listing.exists():
        images = out / "images"
        images.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(16):
            cv2.imwrite(str(images / f"{i}.png"), rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
        rows = "\n".join(f"images/{label % 16}.png,{label}" for label in range(classes))
        listing.write_text("path,label\n" + rows + "\n")
    settings = {
        "data.source": "list", "data.path": str(listing), "data.image_size": "[32,32]",
        "data.augment.horizontal_flip": "false", "model.backbone": "small", "model.embedding_size": "512",
        "head.mode": "tiled", "train.batch_size": "16", "train.log_every": "1",
    }  # fmt: skip
    args = ["-c", str(REPO / "configs/demo.yaml"), "--set", "eval.pairs=null"]
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    return args


CASES = {"demo": demo_args, "head1m": head_1m_args}


def stop_once(args: list[str], run: Path, after: int) -> dict:
    command = [sys.executable, "-m", "facetrain", "train", *args, "-o", str(run), "--nproc", "2", "-q"]
    command += ["--set", "train.steps=100000", "--set", "checkpoint.every=100000"]
    process = subprocess.Popen(
        command, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    while logged_step(run) < after:
        if process.poll() is not None:
            raise SystemExit(f"training ended before step {after}:\n{process.stderr.read()}")
        time.sleep(0.01)
    processes = tree(process.pid)
    sent = time.monotonic()
    for pid in processes:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    process.communicate()
    while any(alive(pid) for pid in processes):
        time.sleep(0.01)
    exit_s = time.monotonic() - sent
    summary = json.loads((run / "summary.json").read_text())
    checkpoint = Path(summary["last_checkpoint"])
    size = sum(path.stat().st_size for path in checkpoint.iterdir())
    return {
        "exit_code": process.returncode,
        "stopped_at": summary["steps"],
        "checkpoint_s": summary["stop_to_checkpoint_s"],
        "exit_s": exit_s,
        "checkpoint_gib": size / 2**30,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/stop_timing"))
    parser.add_argument("--cases", default="demo,head1m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--after", type=int, default=20, help="signal once this step is logged (default 20)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print("| case | checkpoint size (GiB) | signal -> checkpoint (s) | signal -> exit (s) | exit codes |")
    print("|---|---|---|---|---|")
    for case in args.cases.split(","):
        trials = []
        for repeat in range(args.repeats):
            run = args.out / f"{case}_{repeat}"
            if run.exists():
                raise SystemExit(f"{run} exists: choose another --out, or remove it")
            trials.append(stop_once(CASES[case](args.out), run, args.after))
            with (args.out / "trials.jsonl").open("a") as handle:
                handle.write(json.dumps({"case": case, **trials[-1]}) + "\n")
        checkpoint = [trial["checkpoint_s"] for trial in trials]
        exits = [trial["exit_s"] for trial in trials]
        print(
            f"| {case} | {trials[0]['checkpoint_gib']:.2f} | {statistics.median(checkpoint):.2f} "
            f"(max {max(checkpoint):.2f}) | {statistics.median(exits):.2f} (max {max(exits):.2f}) "
            f"| {sorted({trial['exit_code'] for trial in trials})} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
