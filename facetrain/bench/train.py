"""`facetrain bench train`: end-to-end training steps, sharded head against a DDP-replicated full FC.

Both runs time the trainer's own `train_step` (backbone forward/backward, DDP, head, SGD + momentum) on
the same in-memory images, so the figures compare the classifiers inside a real step, without data
loading. The replicated FC is what plain DDP training does: every rank holds all C classes, computes
normalize + linear + margin + cross_entropy on its local batch, and all-reduces the C x D gradient.
The `linear` head is the floor: the backbone under a plain nn.Linear softmax over --linear-classes.
On CUDA a step is timed until its kernels finish and peak memory is the GPU's allocated bytes; ranks
that share a GPU join with gloo (`parallel/workers.py`), which the report states. Each rank runs with the
device's defaults that `facetrain train` sets (cudnn.benchmark and TF32 on CUDA: `train.device_defaults`).

Every step is timed, the warm-up's too: a row's first step is where `--compile` compiles and cuDNN
searches its algorithms. Each row's MFU is its FLOPs an image (`FlopCounterMode`) times its images/s over the GEMM peak each
rank measured on its device after its steps (`bench/train_flops.py`). With `--from-folder DIR` the
margin heads also run as the real `facetrain train` on the images of DIR (`bench/train_folder.py`),
whose images/s are reported beside, and as a fraction of, their pure-compute row; the folder's
identities are then the classes of every row, so the two compare one for one.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import click
import torch
import torch.nn.functional as F
from torch import nn

from facetrain.bench.common import (
    gpu_info,
    machine_info,
    mean_of_max_over_ranks,
    parse_name_list,
    peak_memory,
    timed_repeats,
)
from facetrain.bench.report import ReportFiles, markdown_table, write_report
from facetrain.bench.train_flops import device_peak_flops, flops_per_image, utilisation
from facetrain.bench.train_folder import FOLDER_HEADS, folder_classes, refuse_earlier_runs, run_train_path
from facetrain.devices import resolve_device
from facetrain.errors import FacetrainError
from facetrain.heads import DenseMarginHead, HeadOutput, HeadPlan, ShardedMarginHead, collectives
from facetrain.heads.kernel_choice import resolve_kernel
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.parallel.config import ParallelConfig
from facetrain.parallel.data_parallel import wrap_data_parallel
from facetrain.parallel.dims import ParallelDims, init_parallel
from facetrain.parallel.parallelize import parallelize_backbone
from facetrain.parallel.workers import WorkerPool
from facetrain.registry import Registry
from facetrain.train.device_defaults import (
    apply_device_defaults,
    native_bf16,
    resolve_device_defaults,
    resolve_precision,
    tile_classes,
)
from facetrain.train.optim import OptimConfig, build_fused_optimizer, build_optimizer
from facetrain.train.run_config import Config
from facetrain.train.step import StepParts, StepSettings, train_step

HEAD_OVERHEAD_TARGET = 0.15
# `--from-folder`: the real train path's steady images/s, and its slowest window, as shares of the
# pure-compute step's (issue 56, item 4)
TRAIN_PATH_SHARE_TARGET = 0.95
TRAIN_PATH_WINDOW_TARGET = 0.90
BENCH_OPTIM = OptimConfig(lr=0.01, grad_clip=None)


class LinearSoftmax(nn.Module):
    """A plain classifier: logits = W x + b, cross-entropy; what a backbone costs without a margin head."""

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor) -> HeadOutput:
        logits = self.fc(embeddings)
        accuracy = (logits.detach().argmax(dim=1) == labels).float().mean()
        return HeadOutput(F.cross_entropy(logits.float(), labels), accuracy)


BENCH_TRAIN_HEADS: Registry = Registry("bench train head")


@BENCH_TRAIN_HEADS.register("sharded")
def _sharded(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    local, model, _ = parallelize_backbone(backbone, dims, ParallelConfig(), shape)
    head = ShardedMarginHead(settings["classes"], settings["dim"], margin="arcface", group=dims.dp_group)
    return local, model, head.to(dims.device)


@BENCH_TRAIN_HEADS.register("tiled")
def _tiled(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    """The tiled head with its fused SGD and the tile kernel head.kernel auto picks (Triton on CUDA): the
    trainer's setting for a head that does not fit untiled."""
    local, model, _ = parallelize_backbone(backbone, dims, ParallelConfig(), shape)
    kernel = resolve_kernel("auto", dims.device.type)
    plan = HeadPlan("tiled", tile_classes(None, dims.device.type), fused_optimizer=True, kernel=kernel)
    head = ShardedMarginHead(
        settings["classes"], settings["dim"], margin="arcface", group=dims.dp_group, plan=plan
    )
    head.fuse_optimizer(build_fused_optimizer(BENCH_OPTIM, head, torch.float32))
    return local, model, head.to(dims.device)


def _replicated_head(head: nn.Module, backbone: nn.Module, dims: ParallelDims) -> tuple:
    """Every rank holds the whole classifier; each loss is its own batch's mean, so DDP averages."""
    local = backbone.to(dims.device)
    model = wrap_data_parallel(local, dims.device, dims.dp_group)
    return local, model, wrap_data_parallel(head.to(dims.device), dims.device, dims.dp_group, "mean")


@BENCH_TRAIN_HEADS.register("replicated")
def _replicated(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    head = DenseMarginHead(settings["classes"], settings["dim"], margin="arcface")
    return _replicated_head(head, backbone, dims)


@BENCH_TRAIN_HEADS.register("linear")
def _linear(backbone: nn.Module, dims: ParallelDims, settings: dict, shape) -> tuple:
    return _replicated_head(LinearSoftmax(settings["linear_classes"], settings["dim"]), backbone, dims)


def _train_worker(rank: int, world_size: int, kind: str, settings: dict) -> dict:
    classes = settings["linear_classes"] if kind == "linear" else settings["classes"]
    dim, size, batch = settings["dim"], settings["image_size"], settings["batch"]
    generator = torch.Generator().manual_seed(rank)
    images = torch.randn(batch, 3, size, size, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    dims = init_parallel()
    device = dims.device
    apply_device_defaults(resolve_device_defaults(device.type, Config()), Config())
    step_settings = StepSettings(
        device=device, precision=settings["precision"], channels_last=settings["channels_last"]
    )
    # data loading is not part of the figure: the batch sits on the device in the step's layout
    images = images.to(device, memory_format=step_settings.memory_format)
    labels = labels.to(device)
    with peak_memory(device) as peak:
        torch.manual_seed(0)
        backbone = build_backbone(
            ModelConfig(backbone=settings["backbone"], embedding_size=dim), (size, size)
        ).to(memory_format=step_settings.memory_format)
        if settings["compile"]:  # as model.compile does: in place, compiled on the first warm-up step
            backbone.compile()
        local, model, head = BENCH_TRAIN_HEADS.build(kind, backbone, dims, settings, images.shape)
        fp16 = settings["precision"] == "fp16"
        optimizer = build_optimizer(BENCH_OPTIM, local, head, grad_scaling=fp16)
        scaler = torch.amp.GradScaler(device.type, enabled=fp16)
        batches = itertools.repeat((images, labels))
        # every step timed, the warm-up's too: the first is where compiling and cuDNN's search go
        times = timed_repeats(
            lambda: train_step(batches, StepParts(model, head, optimizer, scaler, step_settings)),
            settings["warmup"] + settings["steps"],
            before_each=collectives.barrier,
            device=device,
        )
    collectives.barrier()  # every rank measures its GEMM peak at once, as its steps ran
    gemm_peak, gemm_peak_precision = device_peak_flops(device, settings["precision"])
    return {
        "times": times[settings["warmup"] :],
        "first_step_s": times[0],
        "peak_bytes": peak.growth_bytes,
        "memory_method": peak.method,
        "gemm_peak_flops": gemm_peak,
        "gemm_peak_precision": gemm_peak_precision,
    }


def head_on_meta(kind: str, settings: dict) -> nn.Module:
    """What `kind`'s head computes, on the meta device for counting: the margin heads' products are
    those of the dense reference head."""
    with torch.device("meta"):
        if kind == "linear":
            return LinearSoftmax(settings["linear_classes"], settings["dim"])
        return DenseMarginHead(settings["classes"], settings["dim"], margin="arcface")


def _targets(rows: dict[str, dict], train_path_rows: list[dict]) -> dict:
    targets = {}
    if "sharded" in rows and "replicated" in rows:
        sharded, replicated = rows["sharded"], rows["replicated"]
        speedup = sharded["images_per_s"] / replicated["images_per_s"]
        ratio = max(sharded["peak_bytes_per_rank"]) / max(max(replicated["peak_bytes_per_rank"]), 1)
        targets["speedup"] = {"value": speedup, "target": ">= 1.5", "pass": speedup >= 1.5}
        targets["peak_memory_ratio"] = {"value": ratio, "target": "<= 0.6", "pass": ratio <= 0.6}
    for head, name in (("sharded", "head_overhead"), ("tiled", "tiled_head_overhead")):
        if head in rows and "linear" in rows:
            overhead = rows[head]["step_s"] / rows["linear"]["step_s"] - 1
            targets[name] = {
                "value": overhead,
                "target": f"<= {HEAD_OVERHEAD_TARGET}",
                "pass": overhead <= HEAD_OVERHEAD_TARGET,
            }
    for row in train_path_rows:  # issue 56: train from disk keeps the pace of the step alone
        compute = rows[row["head"]]["images_per_s"]
        slowest = row["slowest_window_images_per_s"] / compute
        targets[f"{row['head']}_train_path_share"] = {
            "value": row["share_of_compute"],
            "target": f">= {TRAIN_PATH_SHARE_TARGET}",
            "pass": row["share_of_compute"] >= TRAIN_PATH_SHARE_TARGET,
        }
        targets[f"{row['head']}_train_path_slowest_window"] = {
            "value": slowest,
            "target": f">= {TRAIN_PATH_WINDOW_TARGET}",
            "pass": slowest >= TRAIN_PATH_WINDOW_TARGET,
        }
    return targets


def run_train_benchmark(settings: dict) -> dict:
    world_size, device = settings["world_size"], settings["device"]
    threads = max(1, (torch.get_num_threads() or 1) // world_size)
    rows = {}
    train_path_rows = []
    for kind in settings["heads"]:
        with WorkerPool(world_size, threads, device=device) as pool:
            backend = pool.backend
            per_rank = pool.run(_train_worker, kind, settings)
        step_s = mean_of_max_over_ranks([r["times"] for r in per_rank])
        images_per_s = settings["batch"] * world_size / step_s
        flops = flops_per_image(
            settings["backbone"], settings["image_size"], settings["dim"], head_on_meta(kind, settings)
        )
        gemm_peak = sum(r["gemm_peak_flops"] for r in per_rank)
        rows[kind] = {
            "head": kind,
            "classes": settings["linear_classes"] if kind == "linear" else settings["classes"],
            "step_s": step_s,
            "first_step_s": max(r["first_step_s"] for r in per_rank),
            "images_per_s": images_per_s,
            "peak_bytes_per_rank": [r["peak_bytes"] for r in per_rank],
            "memory_method": per_rank[0]["memory_method"],
            "flops_per_image": flops,
            "gemm_peak_flops": gemm_peak,
            "gemm_peak_precision": per_rank[0]["gemm_peak_precision"],
            **utilisation(flops, images_per_s, gemm_peak),
        }
        if settings["from_folder"] and kind in FOLDER_HEADS:
            path = run_train_path(settings, kind, Path(settings["out"]), BENCH_OPTIM)
            share = path["images_per_s"] / images_per_s
            train_path_rows.append({"head": kind, **path, "share_of_compute": share,
                                    **utilisation(flops, path["images_per_s"], gemm_peak)})  # fmt: skip
    return {
        "settings": {**settings, "backend": backend},
        "machine": {
            **machine_info(),
            "gpu": gpu_info(device),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": native_bf16(torch.device(device).type),
        },
        "rows": list(rows.values()),
        "train_path_rows": train_path_rows,
        "targets": _targets(rows, train_path_rows),
    }


FILES = ReportFiles(json="train.json")  # the table is printed, not kept


def table(result: dict) -> str:
    settings = result["settings"]
    lines = [
        f"{settings['world_size']} ranks on {settings['device']} ({settings['backend']}), "
        f"{settings['backbone']} {settings['image_size']}px, {settings['precision']}"
        f"{', channels_last' if settings['channels_last'] else ''}"
        f"{', compiled' if settings.get('compile') else ''}; "
        f"peak memory: {result['rows'][0]['memory_method']}",
        "",
    ]
    titles = ["head", "classes", "first step (s)", "step (s)", "images/s", "peak memory per rank (MiB)", "GFLOP/image",
              "TFLOP/s", "MFU"]  # fmt: skip
    cells = (
        [row["head"], str(row["classes"]), f"{row['first_step_s']:.2f}", f"{row['step_s']:.3f}", f"{row['images_per_s']:.1f}",
         ", ".join(f"{p / 2**20:.0f}" for p in row["peak_bytes_per_rank"]), f"{row['flops_per_image'] / 1e9:.2f}",
         f"{row['achieved_flops'] / 1e12:.3g}", f"{100 * row['mfu']:.1f} %"]
        for row in result["rows"]
    )  # fmt: skip
    numeric = ("classes", "first step (s)", "step (s)", "images/s", "GFLOP/image", "TFLOP/s", "MFU")
    lines += markdown_table(titles, cells, numeric=numeric)
    first = result["rows"][0]
    peak_precision = first["gemm_peak_precision"]
    faster_than_own = (
        "" if peak_precision == settings["precision"] else f", faster here than {settings['precision']}'s"
    )
    lines.append(
        f"\nMFU against the GEMM peak the ranks measured ({peak_precision}{faster_than_own}): "
        f"{first['gemm_peak_flops'] / 1e12:.3g} TFLOP/s"
    )
    if result["train_path_rows"]:
        lines += [
            f"\n`facetrain train` from {settings['from_folder']} (loader workers a rank: {settings['workers']}):",
            "",
        ]
        titles = ["head", "classes", "images/s", "of the compute step", "slowest window", "MFU",
                  "start-up s (setup, first batch, first step)"]  # fmt: skip
        cells = (
            [row["head"], str(row["classes"]), f"{row['images_per_s']:.1f}", f"{100 * row['share_of_compute']:.0f} %",
             f"{row['slowest_window_images_per_s']:.1f}", f"{100 * row['mfu']:.1f} %",
             "{total_s:.1f} ({setup_s:.1f}, {first_batch_s:.1f}, {first_step_s:.1f})".format(**row["startup_s"])]
            for row in result["train_path_rows"]
        )  # fmt: skip
        lines += markdown_table(titles, cells, numeric=("classes", "images/s", "of the compute step", "MFU"))
    for name, target in result["targets"].items():
        verdict = "PASS" if target["pass"] else "MISS"
        lines.append(f"\n{name}: {target['value']:.2f} (target {target['target']}) {verdict}")
    return "\n".join(lines)


def run(
    classes, world_size, backbone, image_size, dim, batch, steps, warmup, heads, linear_classes,
    precision, channels_last, compile_backbone, from_folder, workers, out, device,
) -> None:  # fmt: skip
    """The work of `facetrain bench train` (its options and help: facetrain/cli/bench_train.py)."""
    device = resolve_device(device)
    device_type = torch.device(device).type
    out_dir = Path(out)
    names = parse_name_list(heads, "--heads", BENCH_TRAIN_HEADS.names())
    if from_folder:  # every row trains the folder's identities, so they compare with its train path
        if not Path(from_folder).is_dir():
            raise FacetrainError(f"--from-folder {from_folder}: no such folder (root/<identity>/<image>)")
        refuse_earlier_runs(out_dir, names)
        classes = folder_classes(from_folder)
    settings = {
        "device": device,
        "classes": classes,
        "world_size": world_size,
        "backbone": backbone,
        "image_size": image_size,
        "dim": dim,
        "batch": batch,
        "steps": steps,
        "warmup": warmup,
        "heads": names,
        "linear_classes": linear_classes,
        "precision": resolve_precision(precision, device_type, native_bf16(device_type)),
        "channels_last": channels_last,
        "compile": compile_backbone,
        "from_folder": from_folder,
        "workers": workers,
        "out": str(out_dir),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    result = run_train_benchmark(settings)
    click.echo(write_report(out_dir, result, table(result), FILES))
    click.echo(f"\nwrote {out_dir / FILES.json}")
