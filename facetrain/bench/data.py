"""`facetrain bench data`: images per second that one DataLoader worker turns into training tensors.

A worker is one process on one core, so the pipeline runs in this process with torch and OpenCV held
to one thread. Fixtures are 112x112 JPEG faces from the synthetic renderer (real-looking content
compresses and decodes like real crops; noise would not), stored as an image folder and as a .rec
written from it. The stages are timed cumulatively (read, + decode, + augment and normalize), so the
cost of each stage is the difference between neighbouring columns. Files are in the page cache after
being written, as a dataset read every epoch usually is, so disk speed is not measured. With
--loader-workers, N DataLoader workers deliver batches onto --device as well (`bench/data_loader.py`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import cv2
import numpy as np
import torch

from facetrain.bench.common import gpu_info, machine_info, parse_int_list
from facetrain.bench.data_loader import loader_images_per_second
from facetrain.bench.report import ReportFiles, markdown_table, write_report
from facetrain.data.config import AugmentConfig
from facetrain.data.dataset import FaceDataset, SampleTable
from facetrain.data.decode import decode_image
from facetrain.data.folder import scan_image_folder
from facetrain.data.recordio import scan_recordio, write_recordio
from facetrain.data.synthetic_faces import draw_identity_traits, render_face
from facetrain.data.transforms import build_train_transform
from facetrain.devices import resolve_device
from facetrain.files import refuse_to_overwrite
from facetrain.progress import ProgressBar

TARGET_IMAGES_PER_S = 1500.0
IMAGE_SIZE = 112
JPEG_QUALITY = 95
STAGES = ("read", "read_decode", "full")


def write_jpeg_folder(root: Path, images: int, identities: int, seed: int = 0) -> None:
    """`root/<identity>/<n>.jpg`, `images` faces spread evenly over `identities`."""
    rng = np.random.default_rng(seed)
    traits = [draw_identity_traits(rng) for _ in range(identities)]
    for index in range(images):
        identity = index % identities
        folder = root / f"id{identity:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        face = render_face(traits[identity], rng, IMAGE_SIZE)
        ok, encoded = cv2.imencode(".jpg", face, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
        if not ok:
            raise OSError(f"cannot encode a benchmark JPEG in {folder}")
        (folder / f"{index:06d}.jpg").write_bytes(encoded.tobytes())


@contextmanager
def single_core() -> Iterator[None]:
    """One thread for torch and OpenCV, as in a DataLoader worker; the caller's settings come back after."""
    torch_threads, cv2_threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        torch.set_num_threads(torch_threads)
        cv2.setNumThreads(cv2_threads)


def _stage_functions(table: SampleTable) -> dict[str, Callable[[int], object]]:
    reader = table.reader
    dataset = FaceDataset(table, build_train_transform([IMAGE_SIZE, IMAGE_SIZE], AugmentConfig()))
    return {
        "read": reader.read,
        "read_decode": lambda index: decode_image(reader.read(index), name=reader.name(index)),
        "full": dataset.__getitem__,
    }


def images_per_second(fn: Callable[[int], object], count: int, repeats: int) -> list[float]:
    """One figure per pass over the `count` samples, visited in a fixed shuffled order like an epoch."""
    order = np.random.default_rng(0).permutation(count).tolist()
    for index in order[: min(count, 32)]:
        fn(index)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for index in order:
            fn(index)
        rates.append(count / (time.perf_counter() - start))
    return rates


def run_data_benchmark(
    images: int,
    identities: int,
    repeats: int,
    progress: bool = True,
    loader_workers: tuple[int, ...] = (),
    loader_batch: int = 128,
    device: str = "cpu",
) -> dict:
    loader_rows = []
    with tempfile.TemporaryDirectory(prefix="facetrain-bench-data-") as tmp:
        folder = Path(tmp) / "folder"
        write_jpeg_folder(folder, images, identities)
        rec_path, _ = write_recordio(folder, Path(tmp) / "train", progress=False)
        tables = {"folder": scan_image_folder(folder), "recordio": scan_recordio(rec_path, progress=False)}
        jpeg_bytes = [len(tables["folder"].reader.read(i)) for i in range(images)]
        rows = []
        with (
            single_core(),
            ProgressBar(total=len(tables) * len(STAGES), desc="bench data", disable=not progress) as bar,
        ):
            for source, table in tables.items():
                row: dict = {"source": source}
                for stage, fn in _stage_functions(table).items():
                    rates = images_per_second(fn, images, repeats)
                    row[stage] = {"median_images_per_s": float(np.median(rates)), "per_repeat": rates}
                    bar.update()
                row["pass"] = row["full"]["median_images_per_s"] >= TARGET_IMAGES_PER_S
                rows.append(row)
        transform = build_train_transform([IMAGE_SIZE, IMAGE_SIZE], AugmentConfig())
        for source, table in tables.items():
            for workers in loader_workers:
                figures = loader_images_per_second(
                    FaceDataset(table, transform), workers, loader_batch, repeats, torch.device(device)
                )
                loader_rows.append({"source": source, "device": device, **figures})
    return {
        "settings": {
            "images": images,
            "identities": identities,
            "repeats": repeats,
            "image_size": [IMAGE_SIZE, IMAGE_SIZE],
            "jpeg_quality": JPEG_QUALITY,
            "mean_jpeg_bytes": float(np.mean(jpeg_bytes)),
            "pipeline": "read bytes, cv2.imdecode (BGR->RGB), random horizontal flip, (x - 127.5) / 127.5",
            "threads": "torch 1, OpenCV 1 (one process: one DataLoader worker's share)",
        },
        "target_images_per_s_per_worker": TARGET_IMAGES_PER_S,
        "machine": {**machine_info(), "gpu": gpu_info(device)},
        "rows": rows,
        "loader_rows": loader_rows,
    }


def table(result: dict) -> str:
    rates = ["read (img/s)", "+ decode (img/s)", "+ augment + normalize (img/s)", "target"]
    target = result["target_images_per_s_per_worker"]
    lines = markdown_table(
        ["source", *rates, "result"],
        (
            [row["source"], *(f"{row[stage]['median_images_per_s']:,.0f}" for stage in STAGES),
             f">= {target:,.0f}", "PASS" if row["pass"] else "MISS"]
            for row in result["rows"]
        ),
        numeric=rates,
    )  # fmt: skip
    if result["loader_rows"]:
        loader = ["source", "loader workers", "batch", "onto", "pinned", "images/s"]
        cells = (
            [row["source"], str(row["workers"]), str(row["batch_size"]), row["device"],
             "yes" if row["pin_memory"] else "no", f"{row['images_per_s']:,.0f}"]
            for row in result["loader_rows"]
        )  # fmt: skip
        lines += ["", *markdown_table(loader, cells, numeric=("loader workers", "batch", "images/s"))]
    return "\n".join(lines)


def run(
    images: int,
    identities: int,
    repeats: int,
    out: Path,
    overwrite: bool,
    loader_workers: str,
    loader_batch: int,
    device: str,
) -> None:
    """The work of `facetrain bench data` (its options and help: facetrain/cli/bench_data.py)."""
    device = resolve_device(device)
    workers = tuple(parse_int_list(loader_workers, "--loader-workers", minimum=0)) if loader_workers else ()
    if not overwrite:
        refuse_to_overwrite([out])
    result = run_data_benchmark(images, identities, repeats, True, workers, loader_batch, device)
    click.echo(write_report(out.parent, result, table(result), ReportFiles(json=out.name)))
    click.echo(f"\nwrote {out}")
