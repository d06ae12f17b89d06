"""`facetrain bench train` at a tiny size: both heads measured, targets evaluated, JSON written."""

from __future__ import annotations

import json

from click.testing import CliRunner

from facetrain.cli.bench_train import train_command


def test_bench_train_writes_both_heads_and_targets(tmp_path):
    args = ["--classes", "3000", "--batch", "4", "--image-size", "32", "--dim", "32", "--steps", "1"]
    result = CliRunner().invoke(train_command, [*args, "--warmup", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "train.json").read_text())
    assert [row["head"] for row in report["rows"]] == ["sharded", "replicated"]
    for row in report["rows"]:
        assert row["images_per_s"] > 0 and len(row["peak_bytes_per_rank"]) == 2
    assert set(report["targets"]) == {"speedup", "peak_memory_ratio"}
    assert "speedup:" in result.output
