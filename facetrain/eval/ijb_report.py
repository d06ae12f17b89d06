"""What `facetrain eval --ijb` prints and writes: the TAR@FAR table, NAME.json, NAME_roc.png and the
template-pair scores as NAME_scores.npy (eval_ijbc.py saves the same array as ijbc.npy, so ROC curves
of several models can be drawn together later)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from facetrain.eval.ijb import IjbResult
from facetrain.eval.ijb_roc import IJB_FALSE_ACCEPT_RATES, plotted_points
from facetrain.eval.report import write_json
from facetrain.files import write_atomic


def ijb_report_paths(out_dir: Path, target: str) -> list[Path]:
    name = target.lower()
    return [out_dir / f"{name}.json", out_dir / f"{name}_roc.png", out_dir / f"{name}_scores.npy"]


def ijb_table(result: IjbResult) -> str:
    """The facts of the run, then the TAR@FAR row as papers print it."""
    rows = [
        ("dataset", f"{result.root} ({result.target})"),
        ("faces", f"{result.num_images} in {result.num_templates} templates"),
        (
            "template pairs",
            f"{result.num_pairs} ({result.num_matched} matched, {result.num_pairs - result.num_matched} mismatched)",
        ),
        ("flip test", "on (features summed)" if result.flip else "off"),
        ("ROC AUC", f"{result.roc.auc:.4f}"),
        ("XNorm", f"{result.xnorm:.3f}"),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    headers = ["FAR"] + [f"{far:.0e}" for far in result.tar_at_far]
    values = [f"TAR {result.target}"] + [f"{100 * tar:.2f}" for tar in result.tar_at_far.values()]
    widths = [max(len(h), len(v)) for h, v in zip(headers, values)]
    lines.append("  ".join(h.rjust(w) for h, w in zip(headers, widths)))
    lines.append("  ".join(v.rjust(w) for v, w in zip(values, widths)))
    return "\n".join(lines)


def write_ijb_report(
    result: IjbResult, out_dir: str | Path, extra: dict[str, Any] | None = None
) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = ijb_report_paths(out_dir, result.target)
    write_json(paths[0], {**(extra or {}), **result.as_dict()})
    write_atomic(paths[1], lambda tmp: roc_figure(result).savefig(tmp, format="png"))
    write_atomic(paths[2], lambda tmp: tmp.write_bytes(_npy_bytes(result.scores)))
    return paths


def roc_figure(result: IjbResult) -> Figure:
    """eval_ijbc.py's plot: log FAR from 1e-6 to 1e-1, the TAR@FAR points marked."""
    fpr, tpr = plotted_points(result.roc)
    figure = Figure(figsize=(5, 4), dpi=100)
    axes = figure.add_subplot()
    axes.plot(fpr, tpr, lw=1, label=f"{result.target} (AUC {100 * result.roc.auc:.2f} %)")
    for far, tar in result.tar_at_far.items():
        axes.plot(far, tar, "o", markersize=4, label=f"TAR {100 * tar:.2f} % @ FAR {far:g}")
    axes.set_xscale("log")
    axes.set_xlim(min(IJB_FALSE_ACCEPT_RATES), max(IJB_FALSE_ACCEPT_RATES))
    axes.set_ylim(min(0.3, float(min(result.tar_at_far.values())) * 0.95), 1.0)
    axes.set_xticks(IJB_FALSE_ACCEPT_RATES)
    axes.set_xlabel("false accept rate")
    axes.set_ylabel("true accept rate")
    axes.set_title(f"ROC on {result.target}")
    axes.grid(True, linestyle="--", alpha=0.5)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    return figure


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()
