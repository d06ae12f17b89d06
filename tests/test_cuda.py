"""The CUDA path, run by `pytest -m cuda` (tools/gpu_check.sh) on a machine with a GPU.

Without CUDA every test here is skipped ("needs CUDA") and the module still imports. References are
the single-process CPU computations the CPU suite already trusts (tests/test_head.py, the exported
model's PyTorch output); tolerances are those of fp32 with TF32 matmuls, or of bf16 autocast.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from facetrain.eval.set_names import report_file_name
from facetrain.heads import ShardedMarginHead
from facetrain.models.config import ModelConfig
from facetrain.parallel.workers import WorkerPool
from tests.support.head_plans import head_plan
from tests.support.head_problems import dense_reference, local_rows, make_problem
from tests.support.train_helpers import logged_losses, run_cli, tiny_config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

TOLERANCE = {"fp32": 2e-3, "bf16": 6e-2}  # of the quantity's magnitude: TF32 GEMMs, bf16 autocast
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16}
TILE = 5


def cuda_head_step(weight, embeddings, labels, precision, tile=None, rows=slice(None), margin="arcface"):
    """One forward + backward of this rank's shard on the current GPU; results back on the CPU."""
    device = torch.device("cuda", torch.cuda.current_device())
    # "sum": each rank's embedding gradient is its share, comparable row for row with the reference
    head = ShardedMarginHead(
        weight.shape[0], weight.shape[1], margin=margin, plan=head_plan(tile), gradient_reduction="sum"
    ).to(device)
    head.weight.data.copy_(weight[head.class_start : head.class_stop])
    x = embeddings[rows].to(device).requires_grad_()
    dtype = AUTOCAST[precision]
    with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
        loss, _ = head(x, labels[rows].to(device))
    loss.backward()
    return loss.detach().cpu(), x.grad.cpu(), head.weight.grad.cpu()


def assert_close(actual, expected, precision):
    scale = max(1.0, float(expected.abs().max()))
    assert float((actual.double() - expected.double()).abs().max()) <= TOLERANCE[precision] * scale


def problem(margin="arcface"):
    weight, embeddings, labels = make_problem("spread", torch.float32, num_classes=23, batch=10)
    reference = dense_reference(margin, weight.double(), embeddings.double(), labels)
    return weight, embeddings, labels, reference


@pytest.mark.parametrize("margin", ["arcface", "curricularface"])  # the second modulates the negatives
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("tile", [None, TILE], ids=["sharded", "tiled"])
def test_head_on_cuda_equals_the_dense_cpu_reference(precision, tile, margin):
    weight, embeddings, labels, (loss, grad_x, grad_w, _) = problem(margin)
    got_loss, got_x, got_w = cuda_head_step(weight, embeddings, labels, precision, tile, margin=margin)
    assert_close(got_loss, loss, precision)
    assert_close(got_x, grad_x, precision)
    assert_close(got_w, grad_w, precision)


def shared_gpu_worker(rank, world_size, precision, tile):
    weight, embeddings, labels = make_problem("spread", torch.float32, num_classes=23, batch=10)
    return cuda_head_step(weight, embeddings, labels, precision, tile, local_rows(world_size, rank, 10))


@pytest.mark.parametrize("tile", [None, TILE], ids=["sharded", "tiled"])
def test_two_ranks_on_one_gpu_shard_the_head(tile):
    weight, embeddings, labels, (loss, grad_x, _, _) = problem()
    with WorkerPool(2, threads_per_rank=1, timeout_s=180, collective_timeout_s=60, device="cuda") as pool:
        assert pool.backend == ("nccl" if torch.cuda.device_count() >= 2 else "gloo")
        per_rank = pool.run(shared_gpu_worker, "fp32", tile)
    for rank_loss, _, _ in per_rank:
        assert_close(rank_loss, loss, "fp32")
    assert_close(torch.cat([r[1] for r in per_rank]), grad_x, "fp32")


def train(tmp_path: Path, output: str, *args: str, **sections):
    config = tiny_config(tmp_path, output, **sections)
    result = run_cli("train", "-c", str(config), *args, timeout=300)
    assert result.returncode == 0, failure_lines(result.stderr)
    return config


def failure_lines(stderr: str) -> str:
    """The exception lines of a failed run and its last lines: torch.compile's failures print whole
    graphs, which a plain tail shows instead of the error."""
    lines = stderr.splitlines()
    errors = [line for line in lines if re.match(r"\s*[\w.]*(Error|Exception|Failed)\b", line)]
    return "\n".join([*errors[:20], "...", *lines[-15:]])


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_thirty_steps_lower_the_loss(tmp_path, precision):
    """fp16 runs with the trainer's GradScaler; every precision must learn the synthetic identities."""
    train(tmp_path, "run", train={"steps": 30, "precision": precision}, checkpoint={"every": 30})
    losses = logged_losses(tmp_path / "run")
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < 0.8 * np.mean(losses[:5])


def test_two_ranks_on_one_gpu_train_and_reshard(tmp_path):
    """gloo with CUDA tensors (NCCL refuses two ranks on one GPU); the checkpoint reshards 2 -> 1.
    A torch older than the app's 2.14 (a GPU image's own) must refuse in one line instead."""
    gloo = ("--set", "parallel.backend=gloo")
    if importlib.util.find_spec("torch.distributed.checkpoint.protocol") is None:
        config = tiny_config(tmp_path, "run", train={"steps": 4}, checkpoint={"every": 4})
        result = run_cli("train", "-c", str(config), "--nproc", "2", *gloo, timeout=300)
        assert result.returncode != 0 and "needs torch >= 2.14" in result.stderr, result.stderr[-3000:]
        assert "Traceback" not in result.stderr
        return
    config = train(tmp_path, "run", "--nproc", "2", *gloo, train={"steps": 4}, checkpoint={"every": 4})
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=6", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_00000006" / "meta.json").read_text())
    assert (meta["step"], meta["world_size"]) == (6, 1)


def test_a_cuda_checkpoint_resumes_on_the_cpu_and_back(tmp_path, monkeypatch):
    config = train(tmp_path, "run", train={"steps": 3}, checkpoint={"every": 3})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=5", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=7", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(logged_losses(tmp_path / "run")) == 7


def test_export_of_a_cuda_checkpoint_matches_onnxruntime_and_evaluates_on_cuda(tmp_path):
    pytest.importorskip("onnxruntime")
    train(tmp_path, "run", train={"steps": 3}, checkpoint={"every": 3})
    out = tmp_path / "export"
    result = run_cli(
        "export", str(tmp_path / "run"), "-o", str(out), "--formats", "safetensors,onnx", "--quiet"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "max |diff|" in result.stdout  # the exporter's onnxruntime check against PyTorch, to 1e-4
    pairs = tmp_path / "synth" / "heldout" / "pairs.txt"
    result = run_cli(
        "eval", str(out), "--pairs", str(pairs), "--device", "cuda", "--out", str(tmp_path / "eval")
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "eval" / f"{report_file_name(pairs)}.json").read_text())
    assert 0.0 <= report["accuracy"] <= 1.0


def test_pipeline_of_two_stages_on_cuda(tmp_path):
    """A stage per GPU (nccl). On one GPU two stage processes cannot exchange CUDA activations: gloo has
    no CUDA send/recv and NCCL refuses two ranks on one GPU, so `bench pipeline` refuses in one line."""
    args = ("bench", "pipeline", "--device", "cuda", "--backbone", "small", "--image-size", "32",
            "--batch-size", "8", "--split-sizes", "4", "--microbatches", "2", "--repeats", "1",
            "--steps", "1", "--warmup", "0", "--out", str(tmp_path / "pipeline"))  # fmt: skip
    result = run_cli(*args, timeout=300)
    if torch.cuda.device_count() < 2:
        assert result.returncode == 2 and "needs a GPU per stage" in result.stderr
        return
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "pipeline" / "bench_pipeline.json").read_text())
    assert report["settings"]["device"] == "cuda" and report["runs"]["pipelined"]["images_per_s"] > 0


def test_compiled_backbone_trains(tmp_path):
    if "compile" not in {f.name for f in dataclasses.fields(ModelConfig)}:
        pytest.skip("facetrain has no model.compile option yet; nothing to compile behind it")
    train(tmp_path, "run", model={"compile": True}, train={"steps": 10}, checkpoint={"every": 10})
    losses = logged_losses(tmp_path / "run")
    assert len(losses) == 10 and all(np.isfinite(losses))
