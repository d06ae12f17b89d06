"""One row of the re-id ablation: train a config on CUHK03 `train` for a few seeds, score each run on
`val` (query: camera A, gallery: camera B) with and without k-reciprocal re-ranking.

Each seed is `facetrain train` then `facetrain eval RUN --reid VAL@1 VAL@2 [--rerank]`, the commands a
user types; the row's mean ± std goes to the terminal and OUT/rows.jsonl (docs/accuracy.md, re-id).

    .venv/bin/python tools/ablate_reid.py recipe --seeds 0 1 2
    .venv/bin/python tools/ablate_reid.py no_triplet --set loss.name=margin
    .venv/bin/python tools/ablate_reid.py no_bn_neck --set model.bn_neck=false
    .venv/bin/python tools/ablate_reid.py no_erasing --set data.augment.random_erasing=0
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from protocol import SHARED_DATA, append_row, facetrain, row_parser, summarize  # noqa: E402

from facetrain.eval.retrieval import reid_report_name  # noqa: E402

CUHK03 = SHARED_DATA / "cuhk03"
METRICS = ["rank1", "rank5", "mAP", "rank1_rerank", "mAP_rerank"]


def score(run: Path, val: Path, rerank: bool) -> dict:
    out = run / ("eval_rerank" if rerank else "eval")
    gallery = f"{val}@2"
    facetrain(
        "eval", str(run), "--reid", f"{val}@1", gallery, "--out", str(out), "--quiet", "--overwrite",
        *(["--rerank"] if rerank else []),
    )  # fmt: skip
    return json.loads((out / f"{reid_report_name(gallery)}.json").read_text())


def main() -> None:
    parser = row_parser(__doc__, "seed<N>", "reid_small.yaml", [0, 1, 2], "ablate_reid")
    parser.add_argument("--data", type=Path, default=CUHK03, help="a folder with train/ and val/")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        run = args.out / args.name / f"seed{seed}"
        overrides = [
            f"data.path={args.data.resolve() / 'train'}", f"train.seed={seed}", f"train.output_dir={run}",
            *args.set,
        ]  # fmt: skip
        facetrain(
            "train", "-c", str(args.config), *(f"--set={o}" for o in overrides), "--nproc", str(args.nproc)
        )
        summary = json.loads((run / "summary.json").read_text())
        plain, reranked = (
            score(run, args.data.resolve() / "val", False),
            score(run, args.data.resolve() / "val", True),
        )
        row = {
            "seed": seed, "steps": summary["steps"], "train_s": summary["train_seconds"],
            "rank1": plain["rank1"], "rank5": plain["rank5"], "mAP": plain["mAP"],
            "rank1_rerank": reranked["rank1"], "mAP_rerank": reranked["mAP"],
        }  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    figures = summarize(args.name, rows, METRICS, f"seeds {args.seeds}")
    args.out.mkdir(parents=True, exist_ok=True)
    append_row(
        args.out / "rows.jsonl", {"name": args.name, "set": args.set, "figures": figures, "runs": rows}
    )


if __name__ == "__main__":
    main()
