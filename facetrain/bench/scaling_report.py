"""What `facetrain bench scaling` reports: the validation table, the user cases, the limits, four plots."""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from facetrain.bench.report import ReportFiles, format_bytes, markdown_table, report_footer
from facetrain.bench.scaling_cases import USER_CASES, sweep_classes, sweep_world_sizes

FIGURES = {"memory": "peak_memory_bytes", "bytes sent": "bytes_sent", "step time": "step_s"}


def _validation_lines(validation: dict) -> list[str]:
    settings = validation["settings"]
    lines = [
        f"Model against `facetrain bench head` on the CPU: C {settings['classes']:,}, D {settings['dim']}, "
        f"b {settings['batch_per_rank']} a rank (B = N b), fp32, tiles of {settings['tile_classes']:,}; "
        "measured = slowest or largest rank, time the fastest of the repeats. Time: each configuration's "
        "GEMM rate as measured there, the elementwise passes at "
        f"{validation['gemm_flops_per_elementwise_byte']:.1f} GEMM flops a byte (fitted over all rows).",
        "",
    ]
    titles = [
        "head",
        "N",
        "B",
        "shard",
        "memory model / measured",
        "bytes model / measured",
        "time model / measured",
    ]
    return lines + markdown_table(titles, map(_validation_cells, validation["rows"]))


def _validation_cells(row: dict) -> list[str]:
    model, measured, error = row["model"], row["measured"], row["relative_error"]
    return [
        row["head"],
        str(row["world_size"]),
        str(row["global_batch"]),
        f"{row['shard_classes']:,}",
        f"{format_bytes(model['peak_memory_bytes'])} / {format_bytes(measured['peak_memory_bytes'])} "
        f"({error['peak_memory_bytes']:+.1%})",
        f"{format_bytes(model['bytes_sent'])} / {format_bytes(measured['bytes_sent'])} ({error['bytes_sent']:+.1%})",
        f"{1000 * model['step_s']:.0f} / {1000 * measured['step_s']:.0f} ms ({error['step_s']:+.1%})",
    ]


def _case_lines(cases: list[dict]) -> list[str]:
    titles = [
        "GPUs", "C", "precision", "head", "tile", "memory/GPU (head + r100)", "head sent/step (r100 DDP)",
        "head ms: GEMM + passes + comm", "r100 ms", "head / r100",
    ]  # fmt: skip
    return markdown_table(titles, map(_case_cells, cases))


def _case_cells(case: dict) -> list[str]:
    seconds = case["seconds"]
    head = case["mode"] + (f", Partial FC {case['sample_rate']:g}" if case["sample_rate"] < 1 else "")
    fits = "" if case["fits"] else " **does not fit**"
    return [
        str(case["world_size"]),
        f"{case['classes']:,}",
        case["precision"],
        head,
        f"{case['tile']:,}",
        f"{format_bytes(case['head_memory_bytes'])} + {format_bytes(case['backbone_memory_bytes'])}{fits}",
        f"{format_bytes(case['head_wire_bytes'])} ({format_bytes(case['backbone_wire_bytes'])})",
        f"{1000 * seconds['gemm']:.1f} + {1000 * seconds['elementwise']:.1f} + {1000 * seconds['collectives']:.1f}",
        f"{1000 * case['backbone_s']:.1f}",
        f"{case['head_over_backbone']:.2f}",
    ]


def table(report: dict) -> str:
    lines = []
    if report.get("validation"):
        lines += _validation_lines(report["validation"]) + [""]
    lines += _case_lines(report["cases"])
    return "\n".join(lines + report_footer(report)) + "\n"


def plot_validation(report: dict, path: Path) -> None:
    """Model (line) and measurement (dots) against N, for memory, bytes and time, by head."""
    rows = report["validation"]["rows"] if report.get("validation") else []
    figure = Figure(figsize=(15, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    scales = {"peak_memory_bytes": 2**20, "bytes_sent": 2**10, "step_s": 1e-3}
    units = {"peak_memory_bytes": "MiB (largest rank)", "bytes_sent": "KiB per rank per step", "step_s": "ms"}
    for axis, (title, key) in zip(figure.subplots(1, 3), FIGURES.items()):
        for head in dict.fromkeys(row["head"] for row in rows):
            points = [row for row in rows if row["head"] == head]
            sizes = [row["world_size"] for row in points]
            line = axis.plot(
                sizes, [row["model"][key] / scales[key] for row in points], label=f"{head} model"
            )
            axis.plot(
                sizes, [row["measured"][key] / scales[key] for row in points], "o",
                color=line[0].get_color(), label=f"{head} measured",
            )  # fmt: skip
        axis.set_title(f"{title}: model and bench head")
        axis.set_xlabel("ranks N (b fixed per rank)")
        axis.set_ylabel(units[key])
        axis.grid(True, alpha=0.3)
        if axis.has_data():
            axis.legend()
    figure.savefig(path, dpi=100)


def plot_world_size(report: dict, path: Path) -> None:
    """Per-GPU memory and bytes sent against N, for each user case's C: what shrinks and what grows."""
    figure = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    memory_axis, wire_axis = figure.subplots(1, 2)
    for _, classes in USER_CASES:
        for precision, mode, style in (("fp32", "untiled", "-"), ("bf16", "tiled", "--")):
            rows = sweep_world_sizes(classes, precision, mode)
            sizes = [row["world_size"] for row in rows]
            label = f"C {classes:,.0f}, {precision} {mode}"
            memory_axis.plot(sizes, [row["head_memory_bytes"] / 2**30 for row in rows], style, label=label)
        wire_axis.plot(
            sizes, [row["replicated_fc_wire_bytes"] / 2**20 for row in rows], ":",
            label=f"replicated FC's gradient, C {classes:,.0f}",
        )  # fmt: skip
    wire_axis.plot(sizes, [row["head_wire_bytes"] / 2**20 for row in rows], "-", label="sharded head (any C)")
    wire_axis.plot(
        sizes, [row["backbone_wire_bytes"] / 2**20 for row in rows], "--", label="r100 DDP gradient"
    )
    memory_axis.axhline(80e9 / 2**30, color="grey", linewidth=0.8)
    memory_axis.set_title("head memory per GPU (D 512, b 128; grey: 80 GB)")
    memory_axis.set_ylabel("GiB")
    wire_axis.set_title("bytes each GPU sends per step")
    wire_axis.set_ylabel("MiB")
    for axis in (memory_axis, wire_axis):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("GPUs N")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.savefig(path, dpi=100)


def plot_classes(report: dict, path: Path) -> None:
    """The tiled bf16 head's step per GPU against C, by part, beside r100's; with Partial FC 0.1."""
    figure = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    for axis, world_size in zip(figure.subplots(1, 2), (8, 512)):
        for sample_rate, style in ((1.0, "-"), (0.1, "--")):
            rows = sweep_classes(world_size, "bf16", sample_rate)
            classes = [row["classes"] for row in rows]
            suffix = "" if sample_rate == 1 else f", Partial FC {sample_rate:g}"
            for part in ("gemm", "elementwise", "collectives"):
                values = [1000 * row["seconds"][part] for row in rows]
                axis.plot(classes, values, style, label=f"{part}{suffix}")
            axis.plot(
                classes, [1000 * row["head_s"] for row in rows], style, linewidth=2.5, label=f"head{suffix}"
            )
        axis.axhline(1000 * rows[0]["backbone_s"], color="grey", label="r100 (bf16)")
        axis.set_title(f"{world_size} GPUs, bf16, tiled, b 128: step per GPU")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("classes C")
        axis.set_ylabel("ms")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.savefig(path, dpi=100)


FILES = ReportFiles(
    json="bench_scaling.json",
    table="bench_scaling.md",
    plots={
        "validation_plot": ("bench_scaling_validation.png", plot_validation),
        "world_size_plot": ("bench_scaling_world_size.png", plot_world_size),
        "classes_plot": ("bench_scaling_classes.png", plot_classes),
    },
)
