"""What `facetrain bench head --capacity` reports: targets, a markdown table, memory against C, JSON."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from facetrain.bench.report import ReportFiles, format_bytes, markdown_table, report_footer

# classes per GiB of per-rank peak memory, at the largest C measured for the head
CLASSES_PER_GIB_TARGETS = {"tiled": 250_000, "tiled_bf16": 450_000}
LABELS = {
    "sharded": "untiled sharded + torch SGD",
    "tiled": "tiled + fused SGD, fp32",
    "tiled_bf16": "tiled + fused SGD, bf16",
    "dense": "DDP-replicated FC + torch SGD",
    "naive": "naive concat + torch SGD",
}


def _largest_ok(rows: list[dict], head: str) -> dict | None:
    measured = [row for row in rows if row["head"] == head and row["status"] == "ok"]
    return max(measured, key=lambda row: row["num_classes"]) if measured else None


def _classes_per_gib_target(rows: list[dict], head: str, threshold: int) -> dict:
    name = f"{LABELS[head]}: classes per GiB of per-rank peak memory"
    row = _largest_ok(rows, head)
    if row is None:
        return {"name": name, "threshold": f">= {threshold:,}", "measured": None, "status": "N/A",
                "detail": "not measured"}  # fmt: skip
    measured = row["classes_per_gib"]
    detail = (
        f"{measured:,.0f} at C={row['num_classes']:,} (peak {format_bytes(row['peak_memory_max_bytes'])}, "
        f"{row['bytes_per_class']:,.0f} bytes a class)"
    )
    status = "PASS" if measured >= threshold else "MISS"
    return {"name": name, "threshold": f">= {threshold:,}", "measured": measured, "status": status,
            "detail": detail}  # fmt: skip


def largest_trained(rows: list[dict]) -> dict[str, int]:
    """Per head, the largest C whose one-step run completed (searched with --largest)."""
    found: dict[str, int] = {}
    for row in rows:
        if row.get("largest_attempt") and row["status"] == "ok":
            found[row["head"]] = max(found.get(row["head"], 0), row["num_classes"])
    return found


def evaluate_capacity_targets(rows: list[dict]) -> list[dict]:
    targets = [_classes_per_gib_target(rows, head, t) for head, t in CLASSES_PER_GIB_TARGETS.items()]
    largest = largest_trained(rows)
    targets.append(
        {
            "name": "largest C one process trains (one step, under --memory-limit-gb)",
            "threshold": "reported",
            "measured": largest,
            "status": "N/A",
            "detail": ", ".join(f"{LABELS[h]} {c:,}" for h, c in largest.items()) or "not searched",
        }
    )
    return targets


def _row_cells(row: dict) -> list[str]:
    head = [LABELS[row["head"]], f"{row['num_classes']:,}", str(row["world_size"])]
    if row.get("largest_attempt"):
        head[1] += f" (largest, try {row['largest_attempt']})"
    if row["status"] == "skipped":
        return head + [f"skipped: estimated {format_bytes(row['estimated_total_bytes'])}", "", "", ""]
    if row["status"] == "failed":
        return head + ["failed (see JSON)", "", "", ""]
    return head + [
        format_bytes(row["peak_memory_max_bytes"]),
        f"{row['bytes_per_class']:,.0f}",
        f"{row['classes_per_gib']:,.0f}",
        f"{row['step_s']:.2f}",
    ]


def table(report: dict) -> str:
    titles = ["head", "C", "N", "peak memory/rank", "bytes/class", "classes/GiB", "step s"]
    lines = markdown_table(titles, map(_row_cells, report["results"]))
    settings = report["settings"]
    lines += report_footer(report)
    lines[-1] += (
        f"; device {settings['device']}, B={settings['batch']}, D={settings['dim']}, "
        f"T={settings['tile_classes']}"
    )
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    """Per-rank peak memory against classes per rank, one line per head, with the two floors."""
    rows = [row for row in report["results"] if row["status"] == "ok"]
    dim = report["settings"]["dim"]
    figure = Figure(figsize=(7.5, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    axis = figure.subplots()
    for head in report["settings"]["heads"]:
        points = sorted(
            (r["shard_classes"], r["peak_memory_max_bytes"] / 2**30) for r in rows if r["head"] == head
        )
        if points:
            axis.plot(*zip(*points), marker="o", label=LABELS[head])
    if rows:
        span = [min(r["shard_classes"] for r in rows), max(r["shard_classes"] for r in rows)]
        for bytes_per_dim, label in ((8, "floor fp32: weight + momentum"), (4, "floor bf16")):
            axis.plot(span, [c * bytes_per_dim * dim / 2**30 for c in span], linestyle="--", color="grey",
                      alpha=0.7 if bytes_per_dim == 8 else 0.4, label=label)  # fmt: skip
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("classes per rank")
    axis.set_ylabel("peak memory per rank, one training step (GiB)")
    axis.set_title(
        f"Head capacity, D = {dim}, B = {report['settings']['batch']} ({report['settings']['device']})"
    )
    axis.grid(True, which="both", alpha=0.3)
    if axis.has_data():
        axis.legend(fontsize=8)
    figure.savefig(path, dpi=100)


FILES = ReportFiles(
    json="bench_head_capacity.json",
    table="bench_head_capacity.md",
    plots={"plot": ("bench_head_capacity.png", plot)},
)
