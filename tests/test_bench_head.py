"""`facetrain bench head` at a tiny size: the report has every figure, and the bytes behave as claimed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from facetrain.bench.common import mean_of_max_over_ranks, timed_repeats
from facetrain.bench.head_bytes import summarize_passes, tiled_passes
from facetrain.bench.head_capacity_report import FILES as CAPACITY_FILES
from facetrain.bench.head_cases import BENCH_HEADS, HeadCase
from facetrain.bench.head_peers import PEERS
from facetrain.bench.head_report import FILES
from facetrain.cli import main
from facetrain.process_memory import PeakRss

CLASSES, WORLD_SIZES, BATCH, DIM = (1000, 5000), (1, 2), 16, 32
TINY = [
    "--classes", ",".join(map(str, CLASSES)),
    "--world-sizes", ",".join(map(str, WORLD_SIZES)),
    "--batch", str(BATCH), "--dim", str(DIM), "--steps", "1", "--warmup", "1",
]  # fmt: skip
RESULT_FIELDS = {
    "step_ms",
    "step_ms_each",
    "gemm_ms",
    "step_over_gemm",
    "peak_memory_bytes_per_rank",
    "peak_memory_max_over_min",
    "memory_method",
    "bytes_sent_per_rank_per_step",
    "bytes_by_op_per_rank",
    "estimated_total_bytes",
    "threads_per_rank",
}


def bench(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["bench", "head", *args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, dict, str]:
    out = tmp_path_factory.mktemp("bench_head")
    code, output = bench(*TINY, "--out", str(out))
    assert code == 0, output
    return out, json.loads((out / FILES.names["json"]).read_text()), output


def rows_of(report: dict, head: str, world_size: int) -> dict[int, dict]:
    return {
        row["num_classes"]: row
        for row in report["results"]
        if row["head"] == head and row["world_size"] == world_size
    }


def test_report_has_every_configuration_and_figure(tiny_run):
    out, report, output = tiny_run
    assert {"cpu_model", "cores", "torch", "date"} <= set(report["machine"])
    assert report["machine"]["torch"] == torch.__version__
    assert {"step_time", "gemm_time", "peak_memory", "bytes_sent"} <= set(report["methods"])
    measured = {(r["head"], r["num_classes"], r["world_size"]) for r in report["results"]}
    assert measured == {
        (h, c, n) for h in ("sharded", "tiled", "dense", "naive") for c in CLASSES for n in WORLD_SIZES
    }
    for row in report["results"]:
        assert row["status"] == "ok", row
        assert RESULT_FIELDS <= set(row)
        assert row["step_ms"] > 0 and len(row["peak_memory_bytes_per_rank"]) == row["world_size"]
        assert row["memory_method"] in ("vmhwm-reset", "statm-sampling")
        assert (row["gemm_ms"] is not None) == (row["head"] in ("sharded", "tiled"))
        if row["head"] in ("sharded", "tiled"):
            assert row["step_over_gemm"] == pytest.approx(row["step_ms"] / row["gemm_ms"])
    assert [t["status"] in ("PASS", "MISS", "N/A") for t in report["targets"]] == [True] * 4
    assert (out / FILES.names["plot"]).read_bytes().startswith(b"\x89PNG")
    table = (out / FILES.names["table"]).read_text()
    assert table in output and table.count("| sharded |") == len(CLASSES) * len(WORLD_SIZES)


def test_sharded_bytes_do_not_depend_on_classes(tiny_run):
    _, report, _ = tiny_run
    for world_size in WORLD_SIZES:
        sent = {
            c: row["bytes_sent_per_rank_per_step"]
            for c, row in rows_of(report, "sharded", world_size).items()
        }
        assert sent[CLASSES[0]] == sent[CLASSES[1]]
        assert (min(sent[CLASSES[0]]) > 0) == (world_size > 1)
    bytes_target = next(t for t in report["targets"] if "independent of C" in t["name"])
    assert bytes_target["status"] == "PASS"


def test_dense_and_naive_bytes_grow_with_classes(tiny_run):
    _, report, _ = tiny_run
    for head in ("dense", "naive"):
        rows = rows_of(report, head, 2)
        small, large = (max(rows[c]["bytes_sent_per_rank_per_step"]) for c in CLASSES)
        assert large > small > 0
    for num_classes, row in rows_of(report, "dense", 2).items():
        # DDP's ring all-reduce of the C x D fp32 weight gradient: 2 (N-1)/N of it per rank
        assert row["bytes_sent_per_rank_per_step"] == [num_classes * DIM * 4] * 2


def test_tiled_rows_send_what_the_untiled_head_sends_and_hold_less(tiny_run):
    _, report, _ = tiny_run
    for world_size in WORLD_SIZES:
        sharded, tiled = rows_of(report, "sharded", world_size), rows_of(report, "tiled", world_size)
        for num_classes in CLASSES:
            assert (
                tiled[num_classes]["bytes_sent_per_rank_per_step"]
                == (sharded[num_classes]["bytes_sent_per_rank_per_step"])
            )


def test_tiled_rows_report_their_memory_traffic(tiny_run):
    """The modelled bytes of the largest shard's step (head_bytes.py), the copy bandwidth measured in the
    worker, and what follows from them; the untiled rows have no model."""
    out, report, _ = tiny_run
    for row in report["results"]:
        assert ("traffic" in row) == (row["head"] == "tiled"), row["head"]
        if "traffic" not in row:
            continue
        traffic = row["traffic"]
        shard = max(row["shard_classes_per_rank"])
        expected = summarize_passes(tiled_passes(shard, DIM, BATCH, 4, 4, "torch"))
        assert traffic["bytes_by_kind"] == expected and traffic["bytes_moved"] == expected["total"]
        assert traffic["copy_gbs"] > 0
        assert traffic["achieved_gbs"] == pytest.approx(expected["total"] / row["step_ms"] * 1e3 / 1e9)
        assert traffic["bandwidth_fraction"] == pytest.approx(traffic["achieved_gbs"] / traffic["copy_gbs"])
        assert traffic["floor_ms"] == pytest.approx(expected["total"] / (traffic["copy_gbs"] * 1e9) * 1e3)
    assert "traffic" in report["methods"]
    table = (out / FILES.names["table"]).read_text()
    assert "Memory traffic of the tiled steps" in table
    assert table.count("| tiled | ") == 2 * len(CLASSES) * len(WORLD_SIZES)  # the main table and this one


@pytest.mark.slow
def test_capacity_reports_memory_against_classes_and_the_largest_fit(tmp_path):
    """--capacity at a tiny size: a row per head and C with classes per GiB, the targets, a largest-C
    search confirmed by a run, and the plot. 0.62 GiB is just over the largest estimate of the sweep
    (dense at C=20,000: 0.617 GiB, 0.6 of it the process baseline), so the largest C is predicted from
    20 MiB of head memory (about 120,000 classes, 170 tiles) rather than 100 MiB (636,000 and a step
    five times as long)."""
    code, output = bench(
        "--capacity", "--classes", "2000,20000", "--world-sizes", "1", "--batch", "16", "--dim", "32",
        "--tile-classes", "700", "--heads", "sharded,tiled,tiled_bf16,dense", "--largest", "tiled_bf16",
        "--memory-limit-gb", "0.62", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, output
    report = json.loads((tmp_path / CAPACITY_FILES.names["json"]).read_text())
    sweep = [row for row in report["results"] if not row.get("largest_attempt")]
    assert {(r["head"], r["num_classes"]) for r in sweep} == {
        (h, c) for h in ("sharded", "tiled", "tiled_bf16", "dense") for c in (2000, 20000)
    }
    for row in sweep:
        assert row["status"] == "ok" and row["peak_memory_max_bytes"] > 0
        assert row["classes_per_gib"] == pytest.approx(
            row["num_classes"] / (row["peak_memory_max_bytes"] / 2**30)
        )
    at = {row["head"]: row for row in sweep if row["num_classes"] == 20000}
    assert at["tiled_bf16"]["peak_memory_max_bytes"] < at["tiled"]["peak_memory_max_bytes"]
    assert at["tiled"]["peak_memory_max_bytes"] < at["sharded"]["peak_memory_max_bytes"]
    largest = [row for row in report["results"] if row.get("largest_attempt")]
    assert largest and largest[-1]["status"] == "ok" and largest[-1]["num_classes"] > 20000
    assert [t["status"] for t in report["targets"]][2] == "N/A"
    assert {t["status"] for t in report["targets"][:2]} <= {"PASS", "MISS"}
    assert (tmp_path / CAPACITY_FILES.names["plot"]).read_bytes().startswith(b"\x89PNG")
    assert "classes/GiB" in output


def test_margins_run_each_head_that_takes_one_under_each(tmp_path):
    code, output = bench(
        "--classes", "1000", "--world-sizes", "2", "--batch", str(BATCH), "--dim", str(DIM), "--steps", "1",
        "--heads", "sharded,tiled,sharded_softmax,naive", "--margins", "arcface,adaface,curricularface",
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, output
    rows = {
        (row["head"], row["margin"]): row
        for row in json.loads((tmp_path / FILES.names["json"]).read_text())["results"]
    }
    margins = ("arcface", "adaface", "curricularface")
    expected = {(head, margin) for head in ("sharded", "tiled", "naive") for margin in margins}
    assert set(rows) == expected | {("sharded_softmax", "softmax")}  # no margin of its own: run once
    assert all(rows[head, margin]["status"] == "ok" for head in ("sharded", "tiled") for margin in margins)
    assert rows["naive", "arcface"]["status"] == "ok"
    for margin in ("adaface", "curricularface"):  # the naive baseline cannot give them norms or state
        assert rows["naive", margin]["status"] == "unavailable"
        assert "classic margins only" in rows["naive", margin]["reason"]
    assert "adaface (its defaults) s 64, its fused SGD" in rows["tiled", "adaface"]["computes"]
    table = (tmp_path / FILES.names["table"]).read_text()
    assert "| 1,000 | 2 | tiled curricularface | " in table and "| 1,000 | 2 | tiled | " in table


def test_existing_outputs_need_overwrite(tiny_run):
    out, _, _ = tiny_run
    code, output = bench(*TINY, "--out", str(out))
    assert code == 2 and "already exists" in output and "--overwrite" in output


def test_configurations_over_the_memory_limit_are_skipped(tmp_path):
    code, output = bench(*TINY, "--memory-limit-gb", "0.001", "--out", str(tmp_path))
    assert code == 0, output
    report = json.loads((tmp_path / FILES.names["json"]).read_text())
    assert {row["status"] for row in report["results"]} == {"skipped"}
    assert all(row["estimated_total_bytes"] > 0.001 * 2**30 for row in report["results"])
    assert [t["status"] for t in report["targets"]] == ["N/A"] * 4
    assert "skipped: estimated" in output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "15"], "--batch 15"),
        (["--heads", "sharded,fancy"], "--heads"),
        (["--classes", "1000,x"], "--classes"),
        (["--world-sizes", "0"], "--world-sizes"),
        (["--largest", "tiled"], "--largest belongs to --capacity"),
        (["--margins", "arcface,fancy"], "--margins"),
        (["--capacity", "--margins", "adaface"], "--margins belongs to the head bench without --capacity"),
        (["--capacity", "--largest", "fancy"], "--largest"),
        (
            ["--capacity", "--heads", "tiled", "--largest", "sharded"],
            "--largest sharded is not among --heads",
        ),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, args, message):
    code, output = bench(*TINY, *args, "--out", str(tmp_path))
    assert code == 2 and output.startswith("error: ") and message in output
    assert output.count("\n") == 1 and not list(tmp_path.iterdir())


def test_peak_rss_sees_a_short_lived_allocation():
    size = 64 * 2**20
    with PeakRss() as memory:
        torch.ones(size // 4).sum()
    assert memory.growth_bytes >= 0.9 * size


def test_timing_helpers():
    calls = []
    times = timed_repeats(
        lambda: calls.append("run"), repeats=3, warmup=2, before_each=lambda: calls.append("prep")
    )
    assert len(times) == 3 and calls == ["prep", "run"] * 5
    assert mean_of_max_over_ranks([[1.0, 4.0], [3.0, 2.0]]) == pytest.approx(3.5)


def test_filter_rows_run_the_tiled_heads_at_cce_default():
    """bench head's filter rows: facetrain's heads with Cut Cross-Entropy's default threshold, beside
    CCE's own rows with and without its filter (`--peers cce`)."""
    case = HeadCase("tiled_filter", 40, 1, 8, 16, tile_classes=16)
    head = BENCH_HEADS.build("tiled_filter").build(case)
    assert head.plan.gradient_filter == 2.0**-12 and head.plan.kernel == "torch"
    for name in ("tiled_triton_filter", "tiled_triton_softmax_filter"):
        assert BENCH_HEADS.build(name).gradient_filter == 2.0**-12
    assert "2^-12" in BENCH_HEADS.build("tiled_triton_softmax_filter").describe(case)
    assert PEERS["cce"] == ("cce", "cce_exact")
