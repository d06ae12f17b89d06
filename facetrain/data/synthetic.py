"""The built-in synthetic face set: `OUT/train/<id>/<id>_NNNN.jpg`, plus held-out identities for verification.

Every identity and every image has its own seeded generator (`seed`, identity index, image index), so
the output is byte-identical for a seed regardless of how many processes draw it. Held-out identities
use indices after the training ones, so they are new people, and `heldout/pairs.txt` (LFW View 2
format) makes verification on unseen identities measurable.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import multiprocessing
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
from tqdm import tqdm

from facetrain.config.schema import SynthConfig
from facetrain.data.lfw_pairs import draw_lfw_pairs, write_lfw_pairs
from facetrain.data.synthetic_faces import draw_identity_traits, render_face
from facetrain.errors import FacetrainError

IMAGE_EXTENSION = "jpg"
JPEG_QUALITY = 92
SETTINGS_FILE = "synth.json"
_PAIRS_STREAM = 1_000_003


def identity_name(index: int) -> str:
    return f"id{index:05d}"


def image_name(identity: str, number: int) -> str:
    """LFW naming: images are numbered from 1."""
    return f"{identity}_{number:04d}.{IMAGE_EXTENSION}"


def _write_identity(job: tuple[str, int, int, int, int]) -> None:
    folder, index, count, size, seed = job
    cv2.setNumThreads(1)
    name = identity_name(index)
    traits = draw_identity_traits(np.random.default_rng([seed, index]))
    target = Path(folder) / name
    target.mkdir(parents=True, exist_ok=True)
    for number in range(1, count + 1):
        image = render_face(traits, np.random.default_rng([seed, index, number]), size)
        ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            raise RuntimeError(f"OpenCV could not encode {name} image {number}")
        (target / image_name(name, number)).write_bytes(encoded.tobytes())


def _check_config(cfg: SynthConfig) -> None:
    positive = {
        "identities": cfg.identities,
        "images_per_identity": cfg.images_per_identity,
        "heldout_identities": cfg.heldout_identities,
        "heldout_images_per_identity": cfg.heldout_images_per_identity,
        "pairs_folds": cfg.pairs_folds,
        "pairs_per_fold": cfg.pairs_per_fold,
    }
    for key, value in positive.items():
        if value < 1:
            raise FacetrainError(f"data.synth.{key} must be at least 1, got {value}")
    if cfg.image_size < 32:
        raise FacetrainError(f"data.synth.image_size must be at least 32 pixels, got {cfg.image_size}")
    if cfg.heldout_identities < 2 or cfg.heldout_images_per_identity < 2:
        raise FacetrainError("data.synth needs heldout_identities >= 2 and heldout_images_per_identity >= 2")


def generate_synthetic(
    out_dir: str | Path,
    cfg: SynthConfig,
    overwrite: bool = False,
    progress: bool = True,
    workers: int | None = None,
) -> Path:
    """Write `out_dir/train`, `out_dir/heldout` (with `pairs.txt`) and the settings used; returns `out_dir`.

    Both folders are built under a temporary name and moved into place, `train` last, so an existing
    `train` folder always means a complete set.
    """
    _check_config(cfg)
    out_dir = Path(out_dir)
    existing = [out_dir / part for part in ("train", "heldout") if (out_dir / part).exists()]
    if existing and not overwrite:
        raise FacetrainError(f"{existing[0]} already exists; pass --overwrite to replace the synthetic set")
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = out_dir / f".synth-tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    train_jobs = [
        (str(staging / "train"), index, cfg.images_per_identity, cfg.image_size, cfg.seed)
        for index in range(cfg.identities)
    ]
    heldout_indices = range(cfg.identities, cfg.identities + cfg.heldout_identities)
    heldout_jobs = [
        (str(staging / "heldout"), index, cfg.heldout_images_per_identity, cfg.image_size, cfg.seed)
        for index in heldout_indices
    ]
    workers = workers or min(len(train_jobs) + len(heldout_jobs), len(os.sched_getaffinity(0)))
    try:
        _run_jobs(train_jobs + heldout_jobs, workers, progress)
        counts = {identity_name(index): cfg.heldout_images_per_identity for index in heldout_indices}
        pairs = draw_lfw_pairs(
            counts, cfg.pairs_folds, cfg.pairs_per_fold, np.random.default_rng([cfg.seed, _PAIRS_STREAM])
        )
        write_lfw_pairs(staging / "heldout" / "pairs.txt", pairs)
        for part in ("heldout", "train"):
            shutil.rmtree(out_dir / part, ignore_errors=True)
            os.replace(staging / part, out_dir / part)
        settings = json.dumps(dataclasses.asdict(cfg), indent=2, sort_keys=True) + "\n"
        (staging / SETTINGS_FILE).write_text(settings)
        os.replace(staging / SETTINGS_FILE, out_dir / SETTINGS_FILE)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _run_jobs(jobs: list[tuple[str, int, int, int, int]], workers: int, progress: bool) -> None:
    bar = tqdm(total=len(jobs), desc="drawing identities", unit="id", disable=not progress)
    with bar:
        if workers <= 1:
            for job in jobs:
                _write_identity(job)
                bar.update()
            return
        with multiprocessing.get_context().Pool(workers) as pool:
            for _ in pool.imap_unordered(_write_identity, jobs):
                bar.update()


def ensure_synthetic(root: str | Path, cfg: SynthConfig, progress: bool = True) -> Path:
    """`root/train`, generating the set first when it is missing.

    Several ranks may call this at once: a file lock lets the first one generate while the others
    wait and then read what it wrote.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".synth.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "train").is_dir():
            print(
                f"generating the synthetic face set in {root} ({cfg.identities} identities x "
                f"{cfg.images_per_identity} images, seed {cfg.seed}); later runs reuse it",
                flush=True,
            )
            generate_synthetic(root, cfg, overwrite=True, progress=progress)
        else:
            _warn_if_settings_differ(root, cfg)
    return root / "train"


def _warn_if_settings_differ(root: Path, cfg: SynthConfig) -> None:
    settings_path = root / SETTINGS_FILE
    if not settings_path.is_file():
        return
    try:
        stored = json.loads(settings_path.read_text())
    except (OSError, ValueError):
        return
    if stored != dataclasses.asdict(cfg):
        print(
            f"note: {root} was generated with other data.synth settings than this config; using it as it is "
            f"(run `facetrain synth {root} --overwrite` with the new settings to regenerate)",
            flush=True,
        )
