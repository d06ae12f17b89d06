"""The built-in dataset: synthetic faces written as an image folder, plus a held-out verification set.

`OUT/train/<identity>/<identity>_NNNN.png` holds the training identities; `OUT/heldout/` holds other
identities and an LFW View-2 style `pairs.txt`, so verification measures generalisation to unseen
people. Everything is a function of the seed: the same seed writes the same bytes.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from facetrain.data.config import SynthConfig, check_pairs_settings
from facetrain.data.synthetic_faces import draw_identity_traits, render_face
from facetrain.errors import FacetrainError
from facetrain.progress import ProgressBar

HELDOUT_SEED_OFFSET = 1_000_003
IDENTITY_NAME = re.compile(r"id\d{5,}")
IMAGE_NAME = re.compile(r"id\d{5,}_\d{4,}\.png")


def identity_name(index: int) -> str:
    return f"id{index:05d}"


def _render_identity(job: tuple[Path, str, int, int, int]) -> None:
    folder, name, seed, images, size = job
    rng = np.random.default_rng(seed)
    traits = draw_identity_traits(rng)
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(1, images + 1):
        image = render_face(traits, rng, size)
        ok, encoded = cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        if not ok:
            raise OSError(f"cannot encode {name}_{number:04d}.png")
        (folder / f"{name}_{number:04d}.png").write_bytes(encoded.tobytes())


def write_pairs(
    path: Path, names: list[str], images_per_identity: int, folds: int, per_fold: int, seed: int
) -> None:
    """LFW View-2 format: `folds\tper_fold`, then per fold `per_fold` matched and `per_fold` mismatched."""
    check_pairs_settings(len(names), images_per_identity, folds, per_fold)
    rng = np.random.default_rng(seed)
    lines = [f"{folds}\t{per_fold}"]
    # identities are split over folds, as in LFW, so no person appears in two folds
    groups = np.array_split(rng.permutation(len(names)), folds)
    for group in groups:
        for _ in range(per_fold):
            name = names[rng.choice(group)]
            i, j = rng.choice(np.arange(1, images_per_identity + 1), size=2, replace=False)
            lines.append(f"{name}\t{i}\t{j}")
        for _ in range(per_fold):
            a, b = rng.choice(group, size=2, replace=False)
            i, j = rng.integers(1, images_per_identity + 1, size=2)
            lines.append(f"{names[a]}\t{i}\t{names[b]}\t{j}")
    path.write_text("\n".join(lines) + "\n")


def _render_all(jobs: list[tuple[Path, str, int, int, int]], progress: bool) -> None:
    """Identities are independent, so they render in parallel; each one's images depend only on its seed.

    A daemonic process (a spawned rank of the tests or benchmarks) may not start children, so it renders
    them itself.
    """
    workers = 1 if multiprocessing.current_process().daemon else min(len(jobs), os.cpu_count() or 1)
    bar = ProgressBar(total=len(jobs), desc="synth", unit="identity", disable=not progress)
    with bar:
        if workers <= 1:
            for job in jobs:
                _render_identity(job)
                bar.update()
            return
        with ProcessPoolExecutor(workers) as pool:
            for _ in pool.map(_render_identity, jobs, chunksize=4):
                bar.update()


def generate_synthetic(
    out_dir: str | Path, cfg: SynthConfig, overwrite: bool = False, progress: bool = True
) -> Path:
    """Write the training and held-out sets under `out_dir`; refuse to replace one unless `overwrite`.

    The set is written beside `out_dir` and moved into place when complete, so an interrupted run
    leaves no half-written dataset behind and an existing one is only removed once its replacement is
    ready. Only a set facetrain wrote is ever removed (`foreign_entry`): a folder holding anything else
    is refused, `overwrite` or not, naming the first file that is not facetrain's.
    """
    out_dir = Path(out_dir)
    replacing = out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir()))
    if replacing and not overwrite:
        raise FacetrainError(f"{out_dir} already exists; pass --overwrite to replace it")
    if replacing:
        _check_only_synthetic(out_dir, "--overwrite replaces only a synthetic set facetrain wrote")
    if cfg.identities < 1 or cfg.images_per_identity < 1 or cfg.image_size < 8:
        raise FacetrainError(
            "data.synth needs at least 1 identity with at least 1 image, and image_size >= 8; "
            f"got {cfg.identities} identities x {cfg.images_per_identity} images at {cfg.image_size} px"
        )
    if cfg.heldout_identities < 0 or (cfg.heldout_identities and cfg.heldout_images_per_identity < 1):
        raise FacetrainError("data.synth.heldout_identities must be >= 0, each with >= 1 image")
    if cfg.heldout_identities:
        check_pairs_settings(
            cfg.heldout_identities, cfg.heldout_images_per_identity, cfg.pairs_folds, cfg.pairs_per_fold
        )
    tmp = out_dir.with_name(f".{out_dir.name}.synth-tmp")
    if tmp.exists():  # left by an interrupted run: removed only when it is one
        _check_only_synthetic(tmp, "it is in the way of the set being written")
        shutil.rmtree(tmp)
    train_names = [identity_name(i) for i in range(cfg.identities)]
    heldout_names = [identity_name(cfg.identities + i) for i in range(cfg.heldout_identities)]
    jobs = [
        (tmp / "train" / name, name, cfg.seed * 7919 + i, cfg.images_per_identity, cfg.image_size)
        for i, name in enumerate(train_names)
    ]
    jobs += [
        (
            tmp / "heldout" / name,
            name,
            cfg.seed * 7919 + HELDOUT_SEED_OFFSET + i,
            cfg.heldout_images_per_identity,
            cfg.image_size,
        )
        for i, name in enumerate(heldout_names)
    ]
    try:
        _render_all(jobs, progress)
        if heldout_names:
            write_pairs(
                tmp / "heldout" / "pairs.txt",
                heldout_names,
                cfg.heldout_images_per_identity,
                cfg.pairs_folds,
                cfg.pairs_per_fold,
                cfg.seed,
            )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if replacing:
        shutil.rmtree(out_dir)
    elif out_dir.is_dir():
        out_dir.rmdir()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, out_dir)
    return out_dir


def _check_only_synthetic(folder: Path, why: str) -> None:
    foreign = foreign_entry(folder)
    if foreign is not None:
        raise FacetrainError(
            f"{foreign} was not written by facetrain synth, and {why}: move it out of {folder}, "
            "or choose another folder"
        )


def foreign_entry(folder: Path) -> Path | None:
    """The first path under `folder` that is not part of the layout `generate_synthetic` writes
    (`folder` itself when it is not a plain folder), or None when everything there is facetrain's."""
    if folder.is_symlink() or not folder.is_dir():
        return folder
    for part in sorted(folder.iterdir()):
        if part.name not in ("train", "heldout") or part.is_symlink() or not part.is_dir():
            return part
        for identity in sorted(part.iterdir()):
            if part.name == "heldout" and identity.name == "pairs.txt" and _is_plain_file(identity):
                continue
            if not IDENTITY_NAME.fullmatch(identity.name) or identity.is_symlink() or not identity.is_dir():
                return identity
            for image in sorted(identity.iterdir()):
                if not (image.name.startswith(f"{identity.name}_") and IMAGE_NAME.fullmatch(image.name)):
                    return image
                if not _is_plain_file(image):
                    return image
    return None


def _is_plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()
