"""Settings that depend on the device a run trains on, decided in one place and logged once.

The CPU keeps what facetrain has always done there. On CUDA the defaults are the ones a GPU needs not to
wait on the host or on itself (issue 22, item 7):

- pinned host memory for the loader (`data.pin_memory` null), so `non_blocking=True` copies overlap;
- `cudnn.benchmark`: face crops have one shape, so timing the convolution algorithms once pays back
  within the first steps (off with `train.deterministic`, whose algorithms it would override);
- TF32 for fp32 matmuls (`set_float32_matmul_precision("high")`), tensor cores for the fp32 path;
- a GPU tile for the tiled head (`head.tile_classes` null), see `TILE_CLASSES`: resolved, with the rest
  of the head's plan, by `facetrain.train.head_plan` and logged in its line;
- DDP without `broadcast_buffers`: an NCCL broadcast of every batch-norm buffer each step buys nothing,
  as each replica's statistics are its own batch's anyway and checkpoints keep replica 0's;
- `CUBLAS_WORKSPACE_CONFIG` when `train.deterministic` asks for deterministic algorithms, without which
  cuBLAS GEMMs are not reproducible (torch only warns, as facetrain asks it to);
- persistent loader workers (`data.persistent_workers` null): restarting them at every epoch stalls the
  GPU at each epoch boundary (issue 56 measured the dips with 16 workers); on the CPU the workers share
  the cores with the step, and freeing them between epochs is what facetrain always did.

`train.precision: auto` is resolved here too (issue 56, item 5): bf16 where the device computes bf16
natively (`native_bf16`), fp32 otherwise. A CPU without bf16 units emulates bf16 autocast, and that is
slower than fp32, not faster: an explicit bf16 there is kept, with one warning (`precision_warning`).

A value the config sets explicitly always wins over the device's default.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, MutableMapping

import torch

from facetrain.train.run_config import Config

# Classes per tile of the tiled head when head.tile_classes is null. On a CPU, 8192 keeps the B x T
# logit tile and the T x D weight rows small (the sizes `facetrain bench head` measured as fastest there)
# and each tile's GEMM is long enough that its per-tile overhead does not show. On a GPU a tile costs
# tens of kernel launches whatever its size, so small tiles leave it launch-bound: at C = 1M on one GPU
# 8192 means ~120 tiles and thousands of launches a step (issue 22 counted 7.5-9.3k). 65536 cuts that
# eightfold while a tile's temporaries stay small next to GPU memory: at a global batch of 1024 and
# D = 512 its B x T and T x D temporaries come to about 0.75 GiB (fp32), 1.4 GiB (bf16 storage and
# autocast; `facetrain.heads.memory.memory_parts`).
TILE_CLASSES = {"cpu": 8192, "cuda": 65536}
DETERMINISTIC_CUBLAS_WORKSPACE = ":4096:8"  # what the CUDA docs give for reproducible cuBLAS GEMMs
# bf16 autocast against fp32 on CPUs without bf16 units, the small backbone's training step
# (docs/benchmarks.md, "CPU precision"): eager 2.1-3.2x on an AVX-512 Xeon, 8.8x with it held to AVX2,
# 9-10x on an AVX2-only EPYC; compiled 2.0x, 9.4x and 20x (against fp32 eager) on the same three. What
# the warning of an explicit bf16 there quotes.
BF16_EMULATED_SLOWDOWN = "2-20x"


def native_bf16(device_type: str) -> bool:
    """Whether the device computes bf16 in hardware: a GPU with bf16 tensor cores (Ampere on; torch's
    emulation on older GPUs does not count), a CPU with AVX512-BF16 or AMX tiles (oneDNN's bf16 kernels
    then run on them; without them it converts to fp32 around every operation)."""
    if device_type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device_type == "cpu":
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return False


def resolve_precision(configured: str, device_type: str, native: bool, pipeline_stages: int = 1) -> str:
    """train.precision as the run uses it: auto is bf16 where the device computes it natively (and no
    pipeline, which trains in fp32), else fp32; any other value stays as it is."""
    if configured != "auto":
        return configured
    return "bf16" if native and pipeline_stages == 1 else "fp32"


def precision_warning(precision: str, device_type: str, native: bool) -> str | None:
    """The one line that says an explicit bf16 costs time on this CPU, and what to set instead."""
    if precision != "bf16" or device_type != "cpu" or native:
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return (
        f"warning: train.precision=bf16 on a CPU without bf16 units ({capability}, no AVX512-BF16 or AMX): "
        f"bf16 autocast is emulated there, {BF16_EMULATED_SLOWDOWN} slower a step than fp32, eager or compiled "
        "(docs/benchmarks.md); use --set train.precision=auto (or fp32)"
    )


@dataclasses.dataclass(frozen=True)
class DeviceDefaults:
    device_type: str
    pin_memory: bool
    cudnn_benchmark: bool
    float32_matmul_precision: str  # torch.set_float32_matmul_precision's word: "highest" leaves fp32 alone
    broadcast_buffers: bool  # DDP's, for the backbone
    cublas_workspace_config: str | None  # set in the environment when not None
    precision: str  # train.precision resolved: fp32, bf16 or fp16
    native_bf16: bool  # the device computes bf16 in hardware
    persistent_workers: bool  # the loader's

    def describe(self) -> str:
        """The one log line: what this run uses on its device."""
        on = {True: "on", False: "off"}
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        parts = [
            f"precision {self.precision} ({bf16})",
            f"pin_memory {on[self.pin_memory]}",
            f"persistent_workers {on[self.persistent_workers]}",
            f"DDP broadcast_buffers {on[self.broadcast_buffers]}",
        ]
        if self.device_type == "cuda":
            parts += [
                f"cudnn.benchmark {on[self.cudnn_benchmark]}",
                f"fp32 matmul precision {self.float32_matmul_precision}",
            ]
        if self.cublas_workspace_config is not None:
            parts.append(f"CUBLAS_WORKSPACE_CONFIG={self.cublas_workspace_config}")
        return f"device defaults ({self.device_type}): {', '.join(parts)}"

    @property
    def warning(self) -> str | None:
        """What the run's primary rank warns of once, if anything: an explicit bf16 that costs time."""
        return precision_warning(self.precision, self.device_type, self.native_bf16)


def tile_classes(configured: int | None, device_type: str) -> int:
    return configured if configured is not None else TILE_CLASSES.get(device_type, TILE_CLASSES["cpu"])


def resolve_device_defaults(
    device_type: str,
    cfg: Config,
    environ: MutableMapping[str, str] = os.environ,
    has_native_bf16: Callable[[str], bool] = native_bf16,
) -> DeviceDefaults:
    """The settings a run on `device_type` ("cpu", "cuda") uses; a pure function of its arguments.

    `environ` is read only: a CUBLAS_WORKSPACE_CONFIG the user set is kept (and not reported as ours).
    `has_native_bf16` asks the hardware (tests fake it).
    """
    cuda = device_type == "cuda"
    deterministic = cfg.train.deterministic
    needs_workspace = cuda and deterministic and "CUBLAS_WORKSPACE_CONFIG" not in environ
    native = has_native_bf16(device_type)
    data = cfg.data
    return DeviceDefaults(
        device_type=device_type,
        pin_memory=data.pin_memory if data.pin_memory is not None else cuda,
        cudnn_benchmark=cuda and not deterministic,
        float32_matmul_precision="high" if cuda else "highest",
        broadcast_buffers=not cuda,
        cublas_workspace_config=DETERMINISTIC_CUBLAS_WORKSPACE if needs_workspace else None,
        precision=resolve_precision(cfg.train.precision, device_type, native, cfg.parallel.pipeline_stages),
        native_bf16=native,
        persistent_workers=data.persistent_workers if data.persistent_workers is not None else cuda,
    )


def apply_device_defaults(
    defaults: DeviceDefaults, cfg: Config, environ: MutableMapping[str, str] = os.environ
) -> None:
    """Set the process-wide switches `defaults` names and resolve `cfg`'s null and auto settings in place
    (what the loader, the step and the saved run config then see; head.tile_classes is the head plan's),
    so the run
    goes on holding the one config object it started with.

    On the CPU nothing process-wide is touched. Call it before the first GEMM on the device: cuBLAS
    reads CUBLAS_WORKSPACE_CONFIG when it creates its handle.
    """
    if defaults.cublas_workspace_config is not None:
        environ["CUBLAS_WORKSPACE_CONFIG"] = defaults.cublas_workspace_config
    if defaults.device_type == "cuda":
        torch.backends.cudnn.benchmark = defaults.cudnn_benchmark
        torch.set_float32_matmul_precision(defaults.float32_matmul_precision)
    cfg.data.pin_memory = defaults.pin_memory
    cfg.data.persistent_workers = defaults.persistent_workers
    cfg.train.precision = defaults.precision
