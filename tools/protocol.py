"""What the accuracy tools share: running the CLI, training one seed of a row, summing rows up.

tools/ablate_orl.py (ORL) and tools/ablate_lfw.py (LFW-dev folds) differ only in how they split the
data; the run, the figures read back from `summary.json` and the mean ± std line are the same.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def row_parser(doc: str, runs_under: str, config: str, seeds: list[int], out: str) -> argparse.ArgumentParser:
    """The arguments every row tool takes: the row's name, the config and its overrides, the seeds, the
    ranks and where runs go; each tool adds its own split's."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", help=f"row name: runs go to OUT/NAME/{runs_under}")
    parser.add_argument("-c", "--config", type=Path, default=REPO / "configs" / config)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / out)
    return parser


def write_train_list(root: Path, people: list[str], min_photos: int, path: Path) -> Path:
    """A `data.source: list` CSV of `people`'s photos under `root`, one label per person with at least
    `min_photos` photos."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        label = 0
        for person in people:
            photos = sorted(f for f in (root / person).iterdir() if f.is_file())
            if len(photos) < min_photos:
                continue
            for photo in photos:
                writer.writerow([photo.resolve(), label])
            label += 1
    return path


def join_train_lists(lists: list[Path], path: Path) -> Path:
    """One `data.source: list` CSV of several sets' lists, each set's labels moved past the ones before
    it, so the people of different sets are different classes."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "label"])
        offset = 0
        for train_list in lists:
            with train_list.open(newline="") as source:
                labels = [(row["path"], int(row["label"])) for row in csv.DictReader(source)]
            for photo, label in labels:
                writer.writerow([photo, offset + label])
            offset += max((label for _, label in labels), default=-1) + 1
    return path


def facetrain(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess; its output is shown only when it fails."""
    command = [sys.executable, "-m", "facetrain", *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ})
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return result


def train_and_verify(config: Path, run: Path, overrides: list[str], nproc: int) -> dict:
    """Train `config` with `overrides` into `run`; the verification figures of its last step."""
    started = time.perf_counter()
    facetrain(
        "train", "-c", str(config), *(f"--set={o}" for o in [*overrides, f"train.output_dir={run}"]),
        "--nproc", str(nproc),
    )  # fmt: skip
    wall = time.perf_counter() - started
    summary = json.loads((run / "summary.json").read_text())
    return {
        "steps": summary["steps"],
        "train_s": summary.get("train_seconds"),
        "wall_s": wall,
        **pick_figures(summary["evaluation"]),
        "load_1min": os.getloadavg()[0],
    }


def pick_figures(evaluation: dict) -> dict:
    """The figures a row reports, from a verification report (summary.json's or `facetrain eval`'s)."""
    return {
        "accuracy": evaluation["accuracy"],
        "auc": evaluation["auc"],
        "tar_far_1e-2": evaluation.get("tar_at_far", {}).get("0.01"),
    }


def verify_extra(model: Path, out: Path, pairs: Path | None = None, folder: Path | None = None) -> dict:
    """`facetrain eval` of `model` (a run, whose last checkpoint is read, or a checkpoint) on more pairs,
    its reports written to `out`; the JSON report."""
    source = ["--pairs", str(pairs)] if pairs else ["--folder", str(folder)]
    facetrain("eval", str(model), *source, "--out", str(out), "--quiet")
    return json.loads(next(out.glob("*.json")).read_text())


def mean_std(values: list[float]) -> str:
    """Percent, mean ± sample standard deviation."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * spread:.1f}"


def summarize(name: str, rows: list[dict], metrics: list[str], over: str) -> dict:
    """Print the row's one-line summary and return its figures (mean ± std of each metric)."""
    values = {k: [row[k] for row in rows if row.get(k) is not None] for k in metrics}
    figures = {k: mean_std(v) for k, v in values.items() if v}  # a TAR no run reached is left out
    seconds = [r["train_s"] for r in rows if r.get("train_s") is not None]
    timing = f"training {min(seconds):.0f}-{max(seconds):.0f} s" if seconds else ""
    print(
        f"{name}: " + ", ".join(f"{k} {v}" for k, v in figures.items()) + f" over {over}; "
        f"{rows[0]['steps']} steps, {timing}",
        flush=True,
    )
    return figures


def append_row(rows_file: Path, record: dict) -> None:
    with rows_file.open("a") as handle:
        handle.write(json.dumps(record) + "\n")
