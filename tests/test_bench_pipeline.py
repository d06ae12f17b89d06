"""`facetrain bench pipeline` on a tiny configuration: its JSON, plots and refusal to overwrite.

(The pipeline-parallel split and schedules themselves: tests/test_pipeline.py.)
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from facetrain.bench.pipeline_report import FILES
from facetrain.cli.bench_pipeline import pipeline_command

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_bench_pipeline_writes_json_and_plots_and_keeps_earlier_results(tmp_path):
    args = [
        "--backbone", "small", "--image-size", "16", "--batch-size", "8", "--embedding-size", "8",
        "--microbatches", "2", "--split-sizes", "4,2", "--split-at", "stage3", "--repeats", "2", "--steps", "1",
        "--warmup", "0",
        "--out", str(tmp_path),
    ]  # fmt: skip
    result = CliRunner().invoke(pipeline_command, args)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / FILES.names["json"]).read_text())
    assert set(report["runs"]) == {
        "single_device_1_thread",
        "single_device_2_threads",
        "model_parallel",
        "pipelined",
    }
    assert [row["split_size"] for row in report["sweep"]] == [2, 4, 8]
    assert report["settings"]["split_points"] == ["stage3.down"]
    assert all(len(run["step_s"]) == 2 and run["mean_s"] > 0 for run in report["runs"].values())
    for name in ("bars", "sweep"):
        assert (tmp_path / FILES.names[name]).read_bytes().startswith(b"\x89PNG")
    again = CliRunner().invoke(pipeline_command, args)
    assert again.exit_code != 0 and "--overwrite" in str(again.exception)
