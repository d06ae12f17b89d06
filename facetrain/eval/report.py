"""Evaluation reports: a table for the terminal and files for later (JSON, per-fold CSV, ROC and
score-histogram plot, the histogram of the embedding norms).

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

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from facetrain.eval.metrics import VerificationMetrics, score_counts
from facetrain.eval.norm_summary import PairNorms
from facetrain.eval.retrieval import RetrievalResult
from facetrain.eval.verify_pairs import VerificationResult
from facetrain.files import atomic_target

# Bars of the score histogram: fine enough to show where the humps overlap on LFW's 6,000 pairs,
# coarse enough that a few hundred pairs still fill them.
HISTOGRAM_BINS = 40


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
        *([] if result.norms is None else [("norms", result.norms.summary().describe())]),
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
        *((f"norms ({split})", summary.describe()) for split, summary in (result.norms or {}).items()),
    ]
    return _table(rows)


def write_verification_report(
    result: VerificationResult,
    out_dir: str | Path,
    extra: dict[str, Any] | None = None,
    name: str | None = None,
) -> list[Path]:
    """`<name>.json`, `<name>_folds.csv`, `<name>_roc.png` and, where the norms were measured,
    `<name>_norms.png` in `out_dir`; `extra` joins the JSON, and its `model` and `step` title the plots.

    `name` defaults to the set's own name; `facetrain eval` passes one no other pairs file shares."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = verification_report_paths(out_dir, name or result.name)
    write_json(paths[0], {**(extra or {}), **result.as_dict()})
    _write_bytes(paths[1], _folds_csv(result).encode())
    model, step = (extra or {}).get("model"), (extra or {}).get("step")
    _write_bytes(paths[2], _png(roc_figure(result, model, step)))
    if result.norms is None:
        return paths[:3]
    _write_bytes(paths[3], _png(norms_figure(result.norms, result.name, model, step)))
    return paths


def verification_report_paths(out_dir: Path, name: str) -> list[Path]:
    return [
        out_dir / f"{name}.json",
        out_dir / f"{name}_folds.csv",
        out_dir / f"{name}_roc.png",
        out_dir / f"{name}_norms.png",
    ]


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


def roc_figure(result: VerificationResult, model: str | None = None, step: int | None = None) -> Figure:
    """The ROC beside the genuine and impostor score histograms, titled with the set, the model and its
    step where known: a report page says what was evaluated, and the histograms are where a threshold
    is chosen (how far the two humps overlap, and where the chosen one cuts them)."""
    metrics = result.metrics
    figure = Figure(figsize=(10, 4.2), dpi=100, layout="constrained")
    roc_axes, histogram_axes = figure.subplots(1, 2)
    _draw_roc(roc_axes, metrics)
    _draw_score_histogram(histogram_axes, metrics)
    pairs = "/".join(Path(result.pairs_file).parts[-2:])  # lfw/pairs.txt: which of several pairs.txt
    spread = f"{100 * metrics.accuracy_mean:.2f} ± {100 * metrics.accuracy_std:.2f} %"
    subject = f"{pairs}: accuracy {spread}"
    figure.suptitle(", ".join([subject, *_model_words(model, step)]))
    return figure


def _model_words(model: str | None, step: int | None) -> list[str]:
    words = [f"model {model}"] if model else []
    return words + ([f"step {step}"] if step is not None else [])


def _draw_roc(axes: Axes, metrics: VerificationMetrics) -> None:
    """ROC with a logarithmic FAR axis, where deployed thresholds live, the TAR@FAR points and the
    threshold's operating point marked."""
    roc = metrics.roc
    num_mismatched = metrics.num_pairs - metrics.num_matched
    shown = roc.false_positive_rate > 0
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
    axes.set(xlabel="false accept rate", ylabel="true accept rate", title="ROC")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right", fontsize="small")


def _draw_score_histogram(axes: Axes, metrics: VerificationMetrics) -> None:
    """Genuine (matched) and impostor (mismatched) cosine similarities, each as a density so a set of
    mostly mismatched pairs still shows both shapes, and the deploy threshold as a vertical line."""
    num_mismatched = metrics.num_pairs - metrics.num_matched
    values, matched, mismatched = score_counts(metrics.roc, metrics.num_matched, num_mismatched)
    bins = np.linspace(values.min(), values.max(), HISTOGRAM_BINS + 1)
    for counts, label, colour in (
        (matched, f"genuine ({metrics.num_matched} pairs)", "tab:green"),
        (mismatched, f"impostor ({num_mismatched} pairs)", "tab:red"),
    ):
        axes.hist(
            values,
            bins,
            weights=counts,
            density=True,
            histtype="stepfilled",
            alpha=0.4,
            color=colour,
            label=label,
        )
    threshold = metrics.operating_point.threshold
    axes.axvline(threshold, color="black", linestyle="--", label=f"threshold {threshold:.3f} (balanced)")
    axes.set(xlabel="cosine similarity", ylabel="density", title="scores of genuine and impostor pairs")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="small")


def norms_figure(norms: PairNorms, name: str, model: str | None = None, step: int | None = None) -> Figure:
    """The lower embedding norm (before normalisation) of each matched and each mismatched pair, as
    densities: where matched pairs with a low norm pile up, a quality threshold on the norm would drop
    pairs the model gets wrong. A model that normalises inside says so in the title."""
    summary = norms.summary()
    figure = Figure(figsize=(5, 4), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    low, high = float(norms.lower.min()), float(norms.lower.max())
    bins = np.linspace(low, high, HISTOGRAM_BINS + 1) if high > low else HISTOGRAM_BINS
    for kind, label, colour in ((True, "matched", "tab:green"), (False, "mismatched", "tab:red")):
        values = norms.lower[norms.issame == kind]
        if values.size:
            axes.hist(
                values,
                bins,
                density=True,
                histtype="stepfilled",
                alpha=0.4,
                color=colour,
                label=f"{label} ({values.size} pairs)",
            )
    quantiles = summary.quantiles
    axes.axvline(quantiles["p5"], color="black", linestyle=":", label=f"5% of images {quantiles['p5']:.2f}")
    axes.set(xlabel="lower embedding norm of the pair", ylabel="density")
    axes.set_title(
        "normalised inside the model: every norm is 1"
        if summary.unit
        else "embedding norms before normalisation"
    )
    axes.grid(True, alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    figure.suptitle(", ".join([name, *_model_words(model, step)]), fontsize="medium")
    return figure
