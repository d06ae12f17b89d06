"""The bf16 head against the fp32 head (issue #12): held-out verification accuracy, same seed and recipe.

Rows: the untiled fp32 head (the reference), the tiled head with its fused SGD in fp32, and the tiled
head with a bf16 weight and an fp32 or a bf16 momentum. Each seed trains every row with
`facetrain train --nproc 2` and the same overrides except the head's, so the rows differ only in the
head's arithmetic; the seeds run one after another, all rows of a seed together, so that a load change
on a shared machine hits the rows of a seed alike. `head.tile_classes` is small so that tiles split
each rank's shard unevenly, as on a large run.

Datasets: `orl` trains configs/orl_small.yaml on ORL s1-s30 and verifies on the balanced pairs of the
held-out s31-s40 (tools/ablate_orl.py's split, the tests': 450 matched + 450 mismatched, 10 folds);
`synth` trains configs/demo.yaml on the built-in synthetic faces (200 identities, made once under
OUT) and verifies on its 60 held-out identities (1,200 pairs), at `--image-size` pixels.

    .venv/bin/python tools/head_dtype_matrix.py orl --seeds 0 1 2
    .venv/bin/python tools/head_dtype_matrix.py synth --seeds 0 1 --image-size 56

Prints one JSON line per run and a table (accuracy per seed, mean, mean difference to the reference);
appends the runs to OUT/DATASET/runs.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ORL = REPO.parent / "shared" / "data" / "orl"
TILED = ["head.mode=tiled"]
ROWS = {
    "untiled fp32": ["head.mode=untiled"],
    "tiled fused fp32": TILED,
    "tiled bf16 weight, fp32 momentum": [*TILED, "head.weight_dtype=bf16"],
    "tiled bf16 weight, bf16 momentum": [*TILED, "head.weight_dtype=bf16", "head.state_dtype=bf16"],
}
REFERENCE = "untiled fp32"


def facetrain(*args: str) -> None:
    """The CLI in a subprocess; its output is shown only when it fails."""
    command = [sys.executable, "-m", "facetrain", *args]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=os.environ.copy())
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(command)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}")


def orl_recipe(out: Path, args: argparse.Namespace) -> tuple[Path, list[str]]:
    sys.path.insert(0, str(REPO))
    from tools.ablate_orl import write_orl_split

    train_list, balanced, _ = write_orl_split(args.orl.resolve(), out / "split")
    overrides = ["data.source=list", f"data.path={train_list}", f"eval.pairs={balanced}"]
    return REPO / "configs" / "orl_small.yaml", overrides


def synth_recipe(out: Path, args: argparse.Namespace) -> tuple[Path, list[str]]:
    data = out / f"synth{args.image_size}"
    if not (data / "heldout" / "pairs.txt").exists():
        facetrain("synth", "-o", str(data), "--image-size", str(args.image_size), "--overwrite")
    overrides = [
        f"data.path={data}",
        f"eval.pairs={data / 'heldout' / 'pairs.txt'}",
        f"data.image_size=[{args.image_size}, {args.image_size}]",
        "eval.every=0",
    ]
    return REPO / "configs" / "demo.yaml", overrides


RECIPES = {"orl": orl_recipe, "synth": synth_recipe}


def train(config: Path, overrides: list[str], run: Path) -> dict:
    started = time.perf_counter()
    sets = [f"--set={o}" for o in [*overrides, f"train.output_dir={run}"]]
    facetrain("train", "-c", str(config), *sets, "--nproc", "2")
    summary = json.loads((run / "summary.json").read_text())
    evaluation = summary["evaluation"]
    return {
        "accuracy": evaluation["accuracy"],
        "auc": evaluation["auc"],
        "num_pairs": evaluation["num_pairs"],
        "steps": summary["steps"],
        "wall_s": round(time.perf_counter() - started, 1),
        "load_1min": os.getloadavg()[0],
    }


def table(runs: list[dict]) -> str:
    by_row: dict[str, dict[int, float]] = {}
    for run in runs:
        by_row.setdefault(run["row"], {})[run["seed"]] = run["accuracy"]
    seeds = sorted({run["seed"] for run in runs})
    lines = [
        "| head | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | mean diff to reference |",
        "|---|" + "---|" * (len(seeds) + 2),
    ]
    reference = by_row.get(REFERENCE, {})
    for row, accuracies in by_row.items():
        cells = [f"{100 * accuracies[s]:.2f}" if s in accuracies else "" for s in seeds]
        shared = [s for s in seeds if s in accuracies and s in reference]
        mean = statistics.mean(accuracies.values())
        diff = statistics.mean(accuracies[s] - reference[s] for s in shared) if shared else float("nan")
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {100 * mean:.2f} | {100 * diff:+.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", choices=sorted(RECIPES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tile-classes", type=int, default=4, help="head.tile_classes of the tiled rows")
    parser.add_argument("--image-size", type=int, default=56, help="synth: the images' side in pixels")
    parser.add_argument("--orl", type=Path, default=ORL, help="orl: the ORL root (s1..s40)")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "head_dtype_matrix")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    out = args.out / args.dataset
    config, overrides = RECIPES[args.dataset](args.out, args)
    runs = []
    for seed in args.seeds:
        for row, head in ROWS.items():
            run_dir = out / row.replace(" ", "_").replace(",", "") / f"seed{seed}"
            if run_dir.exists():
                sys.exit(f"{run_dir} exists; remove it or pick another --out")
            head_sets = [*head, f"head.tile_classes={args.tile_classes}"] if row != REFERENCE else head
            figures = train(config, [*overrides, f"train.seed={seed}", *args.set, *head_sets], run_dir)
            record = {"dataset": args.dataset, "row": row, "seed": seed, **figures}
            runs.append(record)
            print(json.dumps(record), flush=True)
            with (out / "runs.jsonl").open("a") as handle:
                handle.write(json.dumps({**record, "set": args.set, "head": head_sets}) + "\n")
    print(table(runs))


if __name__ == "__main__":
    main()
