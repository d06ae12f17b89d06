"""Evaluation reports: a table for the terminal and files for later (JSON, per-fold CSV, ROC plot).

Files are named after what was evaluated (`lfw_pairs.json`, `lfw_pairs_folds.csv`,
`lfw_pairs_roc.png`, `market1501.json`, `market1501_cmc.png`), so several pair sets can share one report folder; the CLI
replaces an earlier report of the same name only with --overwrite. Each file is written to a temporary name first and
then renamed, so an interrupted run never leaves a truncated report.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from facetrain.eval.retrieval import RetrievalResult
from facetrain.eval.verify_pairs import VerificationResult
from facetrain.files import atomic_target


def verification_table(result: VerificationResult) -> str:
    metrics = result.metrics
    point = metrics.operating_point
    num_mismatched = metrics.num_pairs - metrics.num_matched
    majority_answer = "different" if num_mismatched >= metrics.num_matched else "same"
    rows = [
        ("pairs file", result.pairs_file),
        (
            "pairs",
            f"{metrics.num_pairs} ({metrics.num_matched} matched, {num_mismatched} mismatched, "
            f"{result.skipped_pairs} skipped)",
        ),
        ("flip test", "on" if result.flip else "off"),
        (
            "accuracy",
            f"{100 * metrics.accuracy_mean:.2f}% ± {100 * metrics.accuracy_std:.2f}% over "
            f"{len(metrics.folds)} folds ({result.folds_source})",
        ),
        ("baseline", f'{100 * metrics.baseline_accuracy:.2f}% by answering "{majority_answer}" every time'),
        (
            "threshold",
            f"{point.threshold:.4f} (balanced): FAR {100 * point.false_accept_rate:.2f}%, "
            f"TAR {100 * point.true_accept_rate:.2f}%, accuracy {100 * point.accuracy:.2f}% on all pairs",
        ),
        ("ROC AUC", f"{metrics.auc:.4f}"),
        ("EER", f"{100 * metrics.eer:.2f}%"),
        *((f"TAR @ FAR={far:g}", f"{100 * tar:.2f}%") for far, tar in metrics.tar_at_far.items()),
        ("XNorm", f"{result.xnorm:.3f}"),
    ]
    if result.missing_images:
        rows.append(("missing images", f"{len(result.missing_images)}, e.g. {result.missing_images[0]}"))
    return _table(rows)


def retrieval_table(result: RetrievalResult) -> str:
    metrics = result.metrics
    rows = [
        ("dataset", result.root),
        ("queries", f"{metrics.num_queries} scored, {metrics.num_unscored_queries} without a true match"),
        ("gallery", str(metrics.num_gallery)),
        ("flip test", "on" if result.flip else "off"),
        ("re-ranking", "k-reciprocal" if metrics.reranked else "off"),
        *((f"rank-{rank}", f"{100 * rate:.2f}%") for rank, rate in metrics.cmc.items()),
        ("mAP", f"{100 * metrics.mean_ap:.2f}%"),
        ("XNorm", f"{result.xnorm:.3f}"),
    ]
    return _table(rows)


def write_verification_report(
    result: VerificationResult, out_dir: str | Path, extra: dict[str, Any] | None = None
) -> list[Path]:
    """`<name>.json`, `<name>_folds.csv` and `<name>_roc.png` in `out_dir`; `extra` joins the JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = verification_report_paths(out_dir, result.name)
    write_json(paths[0], {**(extra or {}), **result.as_dict()})
    _write_bytes(paths[1], _folds_csv(result).encode())
    _write_bytes(paths[2], _roc_png(result))
    return paths


def verification_report_paths(out_dir: Path, name: str) -> list[Path]:
    return [out_dir / f"{name}.json", out_dir / f"{name}_folds.csv", out_dir / f"{name}_roc.png"]


def retrieval_report_paths(out_dir: Path, name: str) -> list[Path]:
    return [out_dir / f"{name}.json", out_dir / f"{name}_cmc.png"]


def write_retrieval_report(
    result: RetrievalResult, out_dir: str | Path, extra: dict[str, Any] | None = None
) -> list[Path]:
    """`<name>.json` and the CMC curve `<name>_cmc.png` in `out_dir`; `extra` joins the JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = retrieval_report_paths(out_dir, result.name)
    write_json(paths[0], {**(extra or {}), **result.as_dict()})
    _write_bytes(paths[1], _png(cmc_figure(result)))
    return paths


def write_json(path: Path, content: dict[str, Any]) -> None:
    _write_bytes(path, (json.dumps(content, indent=2) + "\n").encode())


def _write_bytes(path: Path, data: bytes) -> None:
    with atomic_target(path) as tmp:
        tmp.write_bytes(data)


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def _folds_csv(result: VerificationResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["fold", "pairs", "threshold", "accuracy"])
    for fold in result.metrics.folds:
        writer.writerow([fold.fold, fold.num_pairs, f"{fold.threshold:.6f}", f"{fold.accuracy:.6f}"])
    return buffer.getvalue()


def _roc_png(result: VerificationResult) -> bytes:
    return _png(roc_figure(result))


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()


def cmc_figure(result: RetrievalResult) -> Figure:
    """The share of queries whose first true match is within rank r, r = 1 up to 50, with mAP."""
    metrics = result.metrics
    curve = metrics.cmc_curve or tuple(metrics.cmc.values())
    ranks = range(1, len(curve) + 1) if metrics.cmc_curve else tuple(metrics.cmc)
    figure = Figure(figsize=(5, 4), dpi=100)
    axes = figure.add_subplot()
    label = f"rank-1 {100 * curve[0]:.1f}%, mAP {100 * metrics.mean_ap:.1f}%"
    axes.plot(list(ranks), [100 * rate for rate in curve], marker=".", label=label)
    axes.set_xlabel("rank")
    axes.set_ylabel("matched within rank (%)")
    reranked = ", re-ranked" if metrics.reranked else ""
    axes.set_title(f"{result.name}: CMC, {metrics.num_queries} queries{reranked}")
    axes.set_ylim(0, 100.5)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    return figure


def roc_figure(result: VerificationResult) -> Figure:
    """ROC with a logarithmic FAR axis, where deployed thresholds live, the TAR@FAR points and the
    threshold's operating point marked."""
    metrics = result.metrics
    roc = metrics.roc
    num_mismatched = metrics.num_pairs - metrics.num_matched
    shown = roc.false_positive_rate > 0
    figure = Figure(figsize=(5, 4), dpi=100)
    axes = figure.add_subplot()
    axes.step(
        roc.false_positive_rate[shown],
        roc.true_positive_rate[shown],
        where="post",
        label=f"AUC {metrics.auc:.4f}",
    )
    # the threshold's point as a hollow square under the TAR@FAR dots: where they coincide (a threshold
    # at FAR 1e-2) both stay visible
    point = metrics.operating_point
    if point.false_accept_rate > 0:
        axes.plot(
            point.false_accept_rate,
            point.true_accept_rate,
            "s",
            markersize=10,
            markerfacecolor="none",
            zorder=3,
            label=f"threshold {point.threshold:.3f}: FAR {100 * point.false_accept_rate:.1f}%",
        )
    for far, tar in metrics.tar_at_far.items():
        axes.plot(far, tar, "o", zorder=4, label=f"TAR {100 * tar:.1f}% @ FAR {far:g}")
    axes.set_xscale("log")
    axes.set_xlim(min(1.0 / num_mismatched, 0.5), 1.0)  # one mismatched pair: not a range of one point
    axes.set_ylim(float(roc.true_positive_rate[shown].min()) * 0.95, 1.005)
    axes.set_xlabel("false accept rate")
    axes.set_ylabel("true accept rate")
    axes.set_title(f"{result.name}: accuracy {100 * metrics.accuracy_mean:.2f}%")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    return figure
