"""`facetrain bench train` at a tiny size: both heads measured, targets evaluated, JSON written; the
FLOPs, GEMM peak and MFU, and the real train path from a folder of JPEGs (`--from-folder`)."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from facetrain.bench import train_flops
from facetrain.bench.data import write_jpeg_folder
from facetrain.bench.train import head_on_meta
from facetrain.bench.train_flops import flops_per_image, gemm_peak_flops, utilisation
from facetrain.cli.bench_train import train_command
from facetrain.errors import FacetrainError
from facetrain.train.device_defaults import native_bf16


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


def test_flops_are_torchs_count_of_the_backbone_plus_the_heads_three_products():
    """r50 at 112x112 is the 32.6 GFLOP an image issue 56 counted; a head of C classes adds its three
    C x D products (logits, embedding gradient, weight gradient), 6 C D an image, whichever head."""
    r50 = flops_per_image("r50", 112, 512)
    assert r50 == pytest.approx(32.61e9, rel=1e-3)
    settings = {"classes": 3000, "linear_classes": 1000, "dim": 32}
    backbone = flops_per_image("small", 32, 32)
    margin = flops_per_image("small", 32, 32, head_on_meta("sharded", settings))
    linear = flops_per_image("small", 32, 32, head_on_meta("linear", settings))
    assert margin - backbone == pytest.approx(6 * 3000 * 32, rel=0.01)
    assert linear - backbone == pytest.approx(6 * 1000 * 32, rel=0.01)


def test_the_gemm_peak_and_utilisation():
    peak = gemm_peak_flops(torch.device("cpu"), "fp32", side=128, repeats=2)
    assert 1e6 < peak < 1e15  # a CPU's FLOP/s, whatever the load
    assert utilisation(2e9, 50.0, 1e12) == {"achieved_flops": 1e11, "mfu": 0.1}


@pytest.mark.parametrize(("bf16_peak", "expected"), [(2e9, (1e10, "fp32")), (4e10, (4e10, "bf16"))])
def test_mfu_is_taken_against_the_faster_of_the_steps_precision_and_fp32(monkeypatch, bf16_peak, expected):
    """A CPU without bf16 units emulates a bf16 GEMM far below fp32's rate (MFUs of 500-800 % against it)."""
    timed = []
    peaks = {"fp32": 1e10, "bf16": bf16_peak}
    monkeypatch.setattr(
        train_flops, "gemm_peak_flops", lambda device, precision: timed.append(precision) or peaks[precision]
    )
    assert train_flops.device_peak_flops(torch.device("cpu"), "bf16") == expected
    assert train_flops.device_peak_flops(torch.device("cpu"), "fp32") == (1e10, "fp32")
    assert timed == ["bf16", "fp32", "fp32"]  # an fp32 step times its GEMM once


def test_bench_train_from_a_folder_runs_the_train_command_beside_the_step(tmp_path):
    folder = tmp_path / "faces"
    write_jpeg_folder(folder, images=24, identities=3)
    args = ["--world-size", "1", "--heads", "sharded", "--batch", "4", "--image-size", "32", "--dim", "16"]
    args += ["--steps", "2", "--warmup", "1", "--precision", "auto", "--workers", "1"]
    out = tmp_path / "bench"
    result = CliRunner().invoke(train_command, [*args, "--from-folder", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "train.json").read_text())
    assert report["settings"]["precision"] == ("bf16" if native_bf16("cpu") else "fp32")
    assert report["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    [row] = report["rows"]
    assert row["classes"] == 3  # the folder's identities
    assert row["flops_per_image"] > 0 and row["gemm_peak_flops"] > 0 and row["first_step_s"] > 0
    assert row["mfu"] == pytest.approx(row["flops_per_image"] * row["images_per_s"] / row["gemm_peak_flops"])
    [path] = report["train_path_rows"]
    assert (path["head"], path["classes"], path["window_steps"], path["windows"]) == ("sharded", 3, 1, 2)
    assert path["images_per_s"] > 0 and path["slowest_window_images_per_s"] <= path["images_per_s"] * 1.0001
    assert path["share_of_compute"] == pytest.approx(path["images_per_s"] / row["images_per_s"])
    assert set(path["startup_s"]) == {"setup_s", "first_batch_s", "first_step_s", "total_s"}
    assert {"sharded_train_path_share", "sharded_train_path_slowest_window"} <= set(report["targets"])
    assert "MFU" in result.output and "of the compute step" in result.output
    again = CliRunner().invoke(train_command, [*args, "--from-folder", str(folder), "--out", str(out)])
    assert isinstance(again.exception, FacetrainError)  # before any step: the earlier run stays
    assert "train_path_sharded exists (an earlier --from-folder run)" in str(again.exception)
