"""`facetrain bench train --from-folder DIR`: the real `facetrain train` on a folder of images, timed
beside the pure-compute step of the same backbone, head, batch and precision.

The compute rows time `train_step` on one batch held on the device; this row is the command a user
runs, in its own processes: the folder scanned, the loader's workers decoding and augmenting JPEGs,
pinned copies to the device, the step gate, the logging. Its images/s come from the run's own
metrics.csv, one figure a window of `log_every` steps after the warm-up windows, so an epoch boundary
that stalls the step shows as a low window rather than vanishing into a mean; its start-up from the
run's summary.json. The run writes its one final checkpoint after the timed steps.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import yaml

from facetrain.data.folder import scan_image_folder
from facetrain.errors import FacetrainError

# bench train's margin heads by the head.mode that trains them; replicated and linear have no train path
FOLDER_HEADS = {"sharded": "untiled", "tiled": "tiled"}
WINDOWS = 5  # log windows timed after the warm-up


def folder_classes(folder: str) -> int:
    """The identities of the folder (`root/<identity>/<image>`), which become the run's classes."""
    return len(scan_image_folder(folder).class_names)


def window_steps(settings: dict) -> tuple[int, int, int]:
    """(steps a log window, warm-up steps, steps of the whole run): whole windows, the warm-up rounded
    up to them."""
    window = max(1, settings["steps"] // WINDOWS)
    warmup = math.ceil(settings["warmup"] / window) * window
    return window, warmup, warmup + window * max(1, settings["steps"] // window)


def train_config(settings: dict, kind: str, run_dir: Path, optim) -> dict:
    window, _, total = window_steps(settings)
    size = settings["image_size"]
    return {
        "data": {
            "source": "folder",
            "path": str(Path(settings["from_folder"]).resolve()),
            "image_size": [size, size],
            "num_workers": settings["workers"],
        },
        "model": {
            "backbone": settings["backbone"],
            "embedding_size": settings["dim"],
            "channels_last": settings["channels_last"],
            "compile": settings["compile"],
        },
        "head": {"margin": "arcface", "mode": FOLDER_HEADS[kind]},
        "optim": {**dataclasses.asdict(optim), "schedule": "constant"},
        "train": {
            "output_dir": str(run_dir),
            "batch_size": settings["batch"],
            "steps": total,
            "precision": settings["precision"],
            "log_every": window,
            "trackers": [],
        },
        "checkpoint": {"every": total},
    }


def train_path_dir(out_dir: Path, kind: str) -> Path:
    return out_dir / f"train_path_{kind}"


def refuse_earlier_runs(out_dir: Path, kinds: list[str]) -> None:
    """Before anything runs: a train path's run directory from an earlier bench is never trained over."""
    for kind in kinds:
        if kind in FOLDER_HEADS and (run_dir := train_path_dir(out_dir, kind)).exists():
            raise FacetrainError(
                f"{run_dir} exists (an earlier --from-folder run): remove it or pass another -o"
            )


def run_train_path(settings: dict, kind: str, out_dir: Path, optim) -> dict:
    """`facetrain train` of `kind`'s head on the folder, in its own processes; its steady images/s
    (the windows after the warm-up together), its slowest window and its start-up seconds."""
    run_dir = train_path_dir(out_dir, kind)
    config_path = out_dir / f"train_path_{kind}.yaml"
    config_path.write_text(yaml.safe_dump(train_config(settings, kind, run_dir, optim)))
    command = [sys.executable, "-m", "facetrain", "train", "-c", str(config_path), "--quiet"]
    if settings["world_size"] > 1:
        command += ["--nproc", str(settings["world_size"])]
    environ = dict(os.environ)
    if settings["device"] == "cpu":  # train takes a GPU wherever torch sees one
        environ["CUDA_VISIBLE_DEVICES"] = ""
    finished = subprocess.run(command, capture_output=True, text=True, env=environ)
    if finished.returncode != 0:
        lines = (finished.stderr or finished.stdout).strip().splitlines() or ["no output"]
        raise FacetrainError(
            f"bench train --from-folder: facetrain train failed ({config_path}): {lines[-1]}"
        )
    window, warmup, _ = window_steps(settings)
    with (run_dir / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row["images_per_s"]]
    steady = [float(row["images_per_s"]) for row in rows if int(row["step"]) > warmup]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        # each window holds the same images: their mean rate is images over the windows' seconds
        "images_per_s": len(steady) / sum(1 / rate for rate in steady),
        "slowest_window_images_per_s": min(steady),
        "windows": len(steady),
        "window_steps": window,
        "startup_s": summary["startup_s"],
        "classes": summary["num_classes"],
        "run_dir": str(run_dir),
    }
