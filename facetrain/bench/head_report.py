"""What `facetrain bench head` reports: the targets, a markdown table, a plot, and the JSON behind them."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from facetrain.bench.head_peers import PEER_HEADS
from facetrain.bench.report import ReportFiles, format_bytes, markdown_table, report_footer

STEP_OVER_GEMM_TARGETS = {"sharded": 1.15, "tiled": 1.5}  # the untiled step, the tiled step with its update
MEMORY_BALANCE_TARGET = 1.1
GEMM_TARGET_CASE = {"world_size": 1, "num_classes": 100_000}


def label(row: dict) -> str:
    """The row's head, with its margin when that is not the one its kind is known by (`--margins`)."""
    return (
        row["head"] if row["margin"] in ("arcface", "softmax", "none") else f"{row['head']} {row['margin']}"
    )


def _measured(rows: list[dict], head: str) -> list[dict]:
    """The targets' rows: the targets are set for the ArcFace head."""
    return [
        row for row in rows if row["head"] == head and row["margin"] == "arcface" and row["status"] == "ok"
    ]


def _target(name: str, threshold: str, measured, passed: bool | None, detail: str) -> dict:
    status = "N/A" if passed is None else ("PASS" if passed else "MISS")
    return {"name": name, "threshold": threshold, "measured": measured, "status": status, "detail": detail}


def _step_over_gemm_target(rows: list[dict], head: str) -> dict:
    threshold = f"<= {STEP_OVER_GEMM_TARGETS[head]}"
    name = f"{head} step time / the untiled step's three GEMMs at N=1, C=100000"
    matches = [row for row in _measured(rows, head) if all(row[k] == v for k, v in GEMM_TARGET_CASE.items())]
    if not matches:
        return _target(name, threshold, None, None, "configuration not measured")
    ratio = matches[0]["step_over_gemm"]
    detail = f"{ratio:.2f}x ({matches[0]['step_ms']:.1f} ms step, {matches[0]['gemm_ms']:.1f} ms GEMMs)"
    return _target(name, threshold, ratio, ratio <= STEP_OVER_GEMM_TARGETS[head], detail)


def _memory_balance_target(rows: list[dict]) -> dict:
    name = "sharded per-rank peak memory max/min"
    multi_rank = [row for row in _measured(rows, "sharded") if row["world_size"] > 1]
    if not multi_rank:
        return _target(name, f"<= {MEMORY_BALANCE_TARGET}", None, None, "no sharded run with N > 1")
    worst = max(multi_rank, key=lambda row: row["peak_memory_max_over_min"])
    ratio = worst["peak_memory_max_over_min"]
    detail = f"worst {ratio:.3f} at C={worst['num_classes']}, N={worst['world_size']}"
    return _target(name, f"<= {MEMORY_BALANCE_TARGET}", ratio, ratio <= MEMORY_BALANCE_TARGET, detail)


def _bytes_independent_of_classes_target(rows: list[dict]) -> dict:
    name = "sharded bytes per rank per step independent of C"
    by_world_size: dict[int, dict[int, list[int]]] = defaultdict(dict)
    for row in _measured(rows, "sharded"):
        by_world_size[row["world_size"]][row["num_classes"]] = row["bytes_sent_per_rank_per_step"]
    compared = {n: per_c for n, per_c in by_world_size.items() if len(per_c) > 1}
    if not compared:
        return _target(name, "identical for every C", None, None, "fewer than two C measured at any N")
    passed = all(len({tuple(sent) for sent in per_c.values()}) == 1 for per_c in compared.values())
    measured = {str(n): {str(c): sent for c, sent in per_c.items()} for n, per_c in compared.items()}
    detail = "; ".join(
        f"N={n}: " + ", ".join(f"C={c} {_bytes_range(sent)}" for c, sent in per_c.items())
        for n, per_c in compared.items()
    )
    return _target(name, "identical for every C", measured, passed, detail)


def evaluate_targets(rows: list[dict]) -> list[dict]:
    return [
        *(_step_over_gemm_target(rows, head) for head in STEP_OVER_GEMM_TARGETS),
        _memory_balance_target(rows),
        _bytes_independent_of_classes_target(rows),
    ]


def _bytes_range(values: list[int]) -> str:
    low, high = format_bytes(min(values)), format_bytes(max(values))
    return low if low == high else f"{low} - {high}"


def _table_row(row: dict) -> list[str]:
    head = [f"{row['num_classes']:,}", str(row["world_size"]), label(row)]
    if row["status"] == "skipped":
        return head + [f"skipped: estimated {format_bytes(row['estimated_total_bytes'])} in all"] + [""] * 6
    if row["status"] == "failed":
        return head + ["failed (see JSON)"] + [""] * 6
    if row["status"] == "unavailable":
        return head + [f"not run: {row['reason']}"] + [""] * 6
    gemm = "" if row["gemm_ms"] is None else f"{row['gemm_ms']:.1f}"
    ratio = "" if row["step_over_gemm"] is None else f"{row['step_over_gemm']:.2f}"
    return head + [
        f"{row['step_ms']:.1f}",
        gemm,
        ratio,
        format_bytes(row["peak_memory_min_bytes"]),
        format_bytes(row["peak_memory_max_bytes"]),
        f"{row['peak_memory_max_over_min']:.2f}",
        _bytes_range(row["bytes_sent_per_rank_per_step"]),
    ]


def table(report: dict) -> str:
    titles = [
        "C",
        "N",
        "head",
        "step ms",
        "GEMM ms",
        "step/GEMM",
        "peak mem/rank min",
        "peak mem/rank max",
        "max/min",
        "sent/rank/step",
    ]
    lines = markdown_table(titles, map(_table_row, report["results"]))
    tables = _computes(report) + traffic_table(report) + peer_table(report)
    return "\n".join(lines + tables + report_footer(report)) + "\n"


def traffic_table(report: dict) -> list[str]:
    """The tiled heads' step against the device's memory bandwidth (`head_bytes.py`); empty without them."""
    titles = ["C", "N", "head", "step ms", "moved", "weight + state", "row copies", "grad tiles", "logit tiles",
              "floor ms", "achieved GB/s", "copy GB/s", "of copy bandwidth"]  # fmt: skip
    cells = []
    for row in report["results"]:
        if row["status"] != "ok" or "traffic" not in row:
            continue
        traffic, parts = row["traffic"], row["traffic"]["bytes_by_kind"]
        cells.append(
            [
                f"{row['num_classes']:,}", str(row["world_size"]), label(row), f"{row['step_ms']:.1f}",
                format_bytes(parts["total"]), *(format_bytes(parts[kind]) for kind in ("weight", "copies", "grad", "logits")),
                f"{traffic['floor_ms']:,.1f}", f"{traffic['achieved_gbs']:.3g}", f"{traffic['copy_gbs']:.3g}",
                f"{100 * traffic['bandwidth_fraction']:.0f} %",
            ]
        )  # fmt: skip
    return ["", "Memory traffic of the tiled steps (modelled bytes, measured bandwidth):", "",
            *markdown_table(titles, cells)] if cells else []  # fmt: skip


def _computes(report: dict) -> list[str]:
    described = {label(row): row.get("computes", "") for row in report["results"]}
    return [
        "",
        "What each head computes: " + "; ".join(f"{head}: {what}" for head, what in described.items()),
    ]


def peer_table(report: dict) -> list[str]:
    """Each peer beside facetrain's fastest and leanest head of the same loss at the same C and N; a
    peer without a margin also beside facetrain's ArcFace heads. Empty without peers."""
    rows = [row for row in report["results"] if row["status"] == "ok"]
    titles = ["C", "N", "peer", "step ms", "peak", "facetrain, same loss as", "fastest", "step ms", "leanest", "peak",
              "facetrain faster", "facetrain lower"]  # fmt: skip
    cells = []
    for peer in (row for row in rows if row["head"] in PEER_HEADS):
        for margin in ("arcface",) if peer["margin"] == "arcface" else ("softmax", "arcface"):
            ours = [
                row for row in rows
                if row["head"] not in PEER_HEADS and row["margin"] == margin
                and (row["num_classes"], row["world_size"]) == (peer["num_classes"], peer["world_size"])
            ]  # fmt: skip
            if not ours:
                continue
            fastest = min(ours, key=lambda row: row["step_ms"])
            leanest = min(ours, key=lambda row: row["peak_memory_max_bytes"])
            faster = fastest["step_ms"] < peer["step_ms"]
            lower = leanest["peak_memory_max_bytes"] < peer["peak_memory_max_bytes"]
            cells.append(
                [
                    f"{peer['num_classes']:,}", str(peer["world_size"]), peer["head"], f"{peer['step_ms']:.1f}",
                    format_bytes(peer["peak_memory_max_bytes"]), margin, fastest["head"],
                    f"{fastest['step_ms']:.1f}", leanest["head"], format_bytes(leanest["peak_memory_max_bytes"]),
                    "yes" if faster else "NO", "yes" if lower else "NO",
                ]
            )  # fmt: skip
    return ["", *markdown_table(titles, cells)] if cells else []


def plot(report: dict, path: Path) -> None:
    """Step time and per-rank peak memory (max, with the min as a lower bar) against N, one column per C."""
    rows = [row for row in report["results"] if row["status"] == "ok"]
    classes = report["settings"]["classes"]
    figure = Figure(figsize=(5.5 * len(classes), 8), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, len(classes), squeeze=False)
    for column, num_classes in enumerate(classes):
        time_axis, memory_axis = axes[0][column], axes[1][column]
        for head in dict.fromkeys(map(label, rows)):
            points = sorted(
                (r["world_size"], r) for r in rows if label(r) == head and r["num_classes"] == num_classes
            )
            if not points:
                continue
            sizes = [n for n, _ in points]
            time_axis.plot(sizes, [r["step_ms"] for _, r in points], marker="o", label=head)
            high = [r["peak_memory_max_bytes"] / 2**20 for _, r in points]
            low = [r["peak_memory_min_bytes"] / 2**20 for _, r in points]
            memory_axis.errorbar(
                sizes,
                high,
                yerr=[[h - lo for h, lo in zip(high, low)], [0] * len(high)],
                marker="o",
                capsize=3,
                label=head,
            )
        time_axis.set_title(f"C = {num_classes:,}: step time (fwd + bwd)")
        time_axis.set_ylabel("ms (slowest rank)")
        memory_axis.set_title(f"C = {num_classes:,}: peak memory per rank")
        memory_axis.set_ylabel("MiB (max rank; bar down to min rank)")
        for axis in (time_axis, memory_axis):
            axis.set_xlabel("world size N")
            axis.set_xticks(report["settings"]["world_sizes"])
            axis.set_yscale("log")
            axis.grid(True, which="both", alpha=0.3)
            if axis.has_data():
                axis.legend()
    figure.savefig(path, dpi=100)


FILES = ReportFiles(json="bench_head.json", table="bench_head.md", plots={"plot": ("bench_head.png", plot)})
