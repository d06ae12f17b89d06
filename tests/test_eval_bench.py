"""`facetrain bench eval` on a tiny configuration: figures are plausible and the JSON is complete."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from facetrain.cli import main


def run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["bench", "eval", *(str(arg) for arg in args)])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_bench_eval_small_run(tmp_path: Path):
    out = tmp_path / "eval.json"
    tiny = [
        "--backbone",
        "small",
        "--image-size",
        "32",
        "--batch-size",
        "4",
        "--batches",
        "2",
        "--threads",
        "1",
    ]
    code, output = run(*tiny, "--pairs", "600", "--repeats", "2", "--out", out, "--quiet")
    assert code == 0, output
    assert (
        "| embedding throughput | small 32x32, batch 4" in output
        and "| verification metrics | 600 pairs" in output
    )
    result = json.loads(out.read_text())
    embedding, metrics = result["embedding"], result["metrics"]
    assert embedding["images_per_s"] == 8 / embedding["seconds"] and embedding["parameters"] > 0
    assert len(metrics["seconds"]) == 2 and metrics["pass"] == (metrics["median_s"] < 1.0)
    assert result["machine"]["cores"] >= 1

    code, output = run(*tiny, "--out", out)
    assert code == 2 and "already exists; pass --overwrite" in output


def test_bench_eval_help_has_examples():
    code, output = run("--help")
    assert code == 0 and "Examples:" in output and "facetrain bench eval --backbone" in output
