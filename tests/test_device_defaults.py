"""Device-dependent defaults (issue 22, items 7 and 8), decided for "cpu" and "cuda" without a GPU.

CPU runs keep what facetrain always did; CUDA runs get pinned memory, cudnn.benchmark, TF32 matmuls, a
GPU tile size, DDP without buffer broadcasts and a cuBLAS workspace for deterministic runs; head.mode
auto on CUDA plans with the GPU's free memory, the backbone's later needs and a margin.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel

from facetrain.errors import FacetrainError
from facetrain.heads.memory import (
    AUTO_MEMORY_FRACTION,
    STATE_COUNT,
    backbone_training_bytes,
    choose_mode,
    cuda_margin,
    estimate_head_memory,
)
from facetrain.heads.plan import HeadPlan
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.train.device_defaults import (
    BF16_EMULATED_SLOWDOWN,
    DETERMINISTIC_CUBLAS_WORKSPACE,
    TILE_CLASSES,
    apply_device_defaults,
    native_bf16,
    resolve_device_defaults,
    tile_classes,
)
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config, load_config
from tests.support.distributed import run_distributed

GiB = 2**30


@pytest.fixture
def process_switches():
    """The process-wide switches CUDA defaults set, restored after the test."""
    saved = torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()
    yield
    torch.backends.cudnn.benchmark = saved[0]
    torch.set_float32_matmul_precision(saved[1])


def without_bf16(device_type: str) -> bool:
    return False


def with_bf16(device_type: str) -> bool:
    return True


def test_cpu_keeps_what_facetrain_always_did():
    defaults = resolve_device_defaults("cpu", Config(), environ={}, has_native_bf16=without_bf16)
    assert dataclasses.astuple(defaults) == ("cpu", False, False, "highest", True, None, "fp32", False, False)


def test_cuda_gets_the_gpu_defaults():
    defaults = resolve_device_defaults("cuda", Config(), environ={}, has_native_bf16=with_bf16)
    assert (defaults.pin_memory, defaults.cudnn_benchmark, defaults.persistent_workers) == (True, True, True)
    assert (defaults.float32_matmul_precision, defaults.broadcast_buffers) == ("high", False)
    assert defaults.cublas_workspace_config is None


def test_deterministic_cuda_gets_a_cublas_workspace_and_no_benchmark():
    cfg = Config()
    cfg.train.deterministic = True
    cuda = resolve_device_defaults("cuda", cfg, environ={})
    assert (cuda.cudnn_benchmark, cuda.cublas_workspace_config) == (False, DETERMINISTIC_CUBLAS_WORKSPACE)
    users = resolve_device_defaults("cuda", cfg, environ={"CUBLAS_WORKSPACE_CONFIG": ":16:8"})
    assert users.cublas_workspace_config is None  # the user's own setting stays
    assert resolve_device_defaults("cpu", cfg, environ={}).cublas_workspace_config is None


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_explicit_settings_win_over_the_device(device_type):
    cfg = Config()
    cfg.data.pin_memory = device_type == "cpu"  # the opposite of the device's default
    cfg.data.persistent_workers = device_type == "cpu"
    cfg.head.tile_classes = 1000
    defaults = resolve_device_defaults(device_type, cfg, environ={})
    assert defaults.pin_memory == defaults.persistent_workers == (device_type == "cpu")
    assert tile_classes(cfg.head.tile_classes, device_type) == 1000
    assert tile_classes(None, device_type) == TILE_CLASSES[device_type]  # what the head plan uses


def test_applying_cpu_defaults_touches_no_process_switch_and_resolves_the_config(process_switches):
    before = torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()
    environ: dict[str, str] = {}
    cfg = Config()
    defaults = resolve_device_defaults("cpu", cfg, environ)
    assert cfg.data.pin_memory is None  # resolving the defaults reads the config, applying them sets it
    apply_device_defaults(defaults, cfg, environ)
    assert (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision()) == before
    assert environ == {}
    # in place, so the run holds one config object
    assert (cfg.data.pin_memory, cfg.data.persistent_workers) == (False, False)
    assert cfg.head.tile_classes is None  # the head plan's


def test_applying_cuda_defaults_sets_the_switches(process_switches):
    cfg = Config()
    cfg.train.deterministic = True
    environ: dict[str, str] = {}
    apply_device_defaults(resolve_device_defaults("cuda", cfg, environ), cfg, environ)
    assert environ == {"CUBLAS_WORKSPACE_CONFIG": DETERMINISTIC_CUBLAS_WORKSPACE}
    assert torch.backends.cudnn.benchmark is False  # deterministic
    assert torch.get_float32_matmul_precision() == "high"
    assert cfg.data.pin_memory is cfg.data.persistent_workers is True
    cfg.train.deterministic = False
    apply_device_defaults(resolve_device_defaults("cuda", cfg, {}), cfg, {})
    assert torch.backends.cudnn.benchmark is True


def test_the_log_is_one_line_naming_each_setting():
    cfg = Config()
    cfg.train.deterministic = True
    line = resolve_device_defaults("cuda", cfg, environ={}, has_native_bf16=with_bf16).describe()
    assert "\n" not in line
    parts = ("precision fp32 (native bf16)", "pin_memory on", "persistent_workers on", "broadcast_buffers off",
             "benchmark off", "high", ":4096:8")  # fmt: skip
    for part in parts:
        assert part in line, part
    assert resolve_device_defaults("cpu", Config(), environ={}, has_native_bf16=without_bf16).describe() == (
        "device defaults (cpu): precision fp32 (no native bf16), pin_memory off, persistent_workers off, "
        "DDP broadcast_buffers on"
    )


def test_null_means_the_device_and_values_stay_checked(tmp_path):
    path = tmp_path / "run.yaml"
    nulls = {"data": {"pin_memory": None, "persistent_workers": None}, "head": {"tile_classes": None}}
    path.write_text(yaml.safe_dump(nulls))
    cfg = load_config(path)
    assert (cfg.data.pin_memory, cfg.data.persistent_workers, cfg.head.tile_classes) == (None, None, None)
    validate(cfg)
    path.write_text(yaml.safe_dump({"head": {"tile_classes": 0}}))
    with pytest.raises(FacetrainError, match="head.tile_classes = 0: must be >= 1"):
        validate(load_config(path))


# ---- train.precision auto (issue 56, item 5) ------------------------------------------------------


@pytest.mark.parametrize(
    ("device_type", "native", "expected"),
    [("cpu", False, "fp32"), ("cpu", True, "bf16"), ("cuda", True, "bf16"), ("cuda", False, "fp32")],
)
def test_auto_precision_is_bf16_only_where_the_device_computes_it(device_type, native, expected):
    cfg = load_config(overrides=["train.precision=auto"])
    asked = []

    def capability(device: str) -> bool:
        asked.append(device)
        return native

    defaults = resolve_device_defaults(device_type, cfg, environ={}, has_native_bf16=capability)
    assert (defaults.precision, asked) == (expected, [device_type])
    assert defaults.warning is None  # auto never picks what costs time
    assert f"precision {expected} ({'native' if native else 'no native'} bf16)" in defaults.describe()


def test_applying_the_defaults_puts_the_resolved_precision_in_the_config():
    """What the run, its saved config.yaml and its checkpoints hold from then on."""
    cfg = load_config(overrides=["train.precision=auto"])
    apply_device_defaults(resolve_device_defaults("cpu", cfg, {}, has_native_bf16=with_bf16), cfg, {})
    assert cfg.train.precision == "bf16"


def test_auto_precision_with_a_pipeline_is_fp32_and_passes_the_pipeline_rule():
    cfg = load_config(overrides=["train.precision=auto", "parallel.pipeline_stages=2"])
    validate(cfg, world_size=2)
    assert resolve_device_defaults("cuda", cfg, environ={}, has_native_bf16=with_bf16).precision == "fp32"


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("native", [False, True])
def test_explicit_precisions_are_kept(precision, native):
    cfg = load_config(overrides=[f"train.precision={precision}"])
    capability = with_bf16 if native else without_bf16
    assert resolve_device_defaults("cuda", cfg, environ={}, has_native_bf16=capability).precision == precision


def test_explicit_bf16_warns_on_a_cpu_without_bf16_units_only():
    bf16 = load_config(overrides=["train.precision=bf16"])
    emulated = resolve_device_defaults("cpu", bf16, environ={}, has_native_bf16=without_bf16)
    warning = emulated.warning
    assert emulated.precision == "bf16" and warning is not None and "\n" not in warning
    for part in (BF16_EMULATED_SLOWDOWN, "slower", "train.precision=auto", "fp32", "AVX512-BF16 or AMX"):
        assert part in warning, part
    assert resolve_device_defaults("cpu", bf16, environ={}, has_native_bf16=with_bf16).warning is None
    assert resolve_device_defaults("cuda", bf16, environ={}, has_native_bf16=without_bf16).warning is None
    fp32 = resolve_device_defaults("cpu", Config(), environ={}, has_native_bf16=without_bf16)
    assert fp32.warning is None


def test_the_hardware_probe_asks_torch(monkeypatch):
    for avx512_bf16, amx, expected in ((False, False, False), (True, False, True), (False, True, True)):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda value=avx512_bf16: value)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda value=amx: value)
        assert native_bf16("cpu") is expected
    emulation = []
    monkeypatch.setattr(
        torch.cuda,
        "is_bf16_supported",
        lambda including_emulation: emulation.append(including_emulation) or False,
    )
    assert native_bf16("cuda") is False and emulation == [False]  # emulated bf16 on old GPUs is not native
    assert native_bf16("meta") is False


def ddp_buffers_worker(rank: int, world_size: int, broadcast_buffers: bool) -> dict:
    from facetrain.parallel.data_parallel import wrap_data_parallel

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model = wrap_data_parallel(module, torch.device("cpu"), broadcast_buffers=broadcast_buffers)
    for step in range(2):
        inputs = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 * rank + step))
        model(inputs).square().mean().backward()
    return {
        "ddp": isinstance(model, DistributedDataParallel),
        "broadcast": model.broadcast_buffers,
        "grad": module[0].weight.grad,
        "running_mean": module[1].running_mean,
    }


def test_ddp_without_buffer_broadcasts_keeps_rank_local_statistics_and_shared_gradients():
    results = run_distributed(ddp_buffers_worker, 2, False)
    assert all(r["ddp"] and r["broadcast"] is False for r in results)
    assert torch.allclose(results[0]["grad"], results[1]["grad"])
    assert not torch.allclose(results[0]["running_mean"], results[1]["running_mean"])


# ---- head.mode auto (item 8) -------------------------------------------------------------------


def test_the_cuda_margin_is_a_tenth_of_free_memory_and_at_least_a_gib():
    assert cuda_margin(5 * GiB) == GiB
    assert cuda_margin(40 * GiB) == 4 * GiB


def test_auto_on_cuda_fits_the_head_into_free_memory_less_backbone_and_margin():
    untiled = estimate_head_memory(100_000, 512, 1024, HeadPlan())
    free = 20 * GiB
    room = free - cuda_margin(free) - untiled.total  # the most the backbone may reserve
    assert choose_mode("auto", untiled, free, False, device_type="cuda", reserved_bytes=room) == "untiled"
    assert choose_mode("auto", untiled, free, False, device_type="cuda", reserved_bytes=room + 1) == "tiled"
    assert choose_mode("auto", untiled, free, True, device_type="cuda") == "tiled"  # bf16 storage
    assert choose_mode("untiled", untiled, 0, False, device_type="cuda") == "untiled"


def test_auto_on_cuda_uses_more_than_the_cpus_half_and_the_cpu_rule_is_unchanged():
    untiled = estimate_head_memory(1_000_000, 512, 1024, HeadPlan())
    free = untiled.total + 2 * GiB
    assert untiled.total > AUTO_MEMORY_FRACTION * free
    assert choose_mode("auto", untiled, free, False) == "tiled"
    assert choose_mode("auto", untiled, free, False, device_type="cuda") == "untiled"
    assert choose_mode("auto", untiled, 2 * untiled.total, False) == "untiled"


def test_reduced_precision_gemm_counts_the_16_bit_copy_of_the_class_rows():
    rows, batch = 50_000, 256
    fp32 = estimate_head_memory(rows, 512, batch, HeadPlan())
    autocast = estimate_head_memory(rows, 512, batch, HeadPlan(), reduced_precision_gemm=True)
    # the rows' 16-bit copy replaces the row-wise dot's fp32 block (never alive beside it); the logit
    # gradient gets a 16-bit copy too
    assert autocast.step - fp32.step == 2 * rows * 512 - 8192 * 512 * 4 + 2 * batch * rows
    assert autocast.persistent == fp32.persistent


def small_backbone(checkpointing: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = ModelConfig(backbone="small", embedding_size=64, activation_checkpointing=checkpointing)
    return build_backbone(model, (112, 112))


def activation_bytes(backbone: torch.nn.Module, batch: int) -> int:
    parameters = sum(p.numel() * 4 for p in backbone.parameters())
    return backbone_training_bytes(backbone, (batch, 3, 112, 112)) - (1 + STATE_COUNT["sgd"]) * parameters


def test_backbone_reserve_counts_gradients_optimizer_state_and_activations():
    backbone = small_backbone()
    parameters = sum(p.numel() * 4 for p in backbone.parameters())
    sgd = backbone_training_bytes(backbone, (8, 3, 112, 112), "sgd")
    assert backbone_training_bytes(backbone, (8, 3, 112, 112), "adamw") - sgd == parameters
    assert backbone_training_bytes(backbone, (8, 3, 112, 112), "sgd", replicated=True) - sgd == parameters
    eight, sixteen = activation_bytes(backbone, 8), activation_bytes(backbone, 16)
    # the first convolution's output alone (24 channels at 56 x 56) is kept for its batch norm
    assert eight > 8 * 24 * 56 * 56 * 4
    assert sixteen == pytest.approx(2 * eight, rel=0.01)  # activations grow with the batch
    assert activation_bytes(small_backbone(checkpointing=True), 8) < eight


def test_the_backbone_estimate_runs_nothing_real():
    backbone = small_backbone()
    backbone.eval()
    state = {name: tensor.clone() for name, tensor in backbone.state_dict().items()}
    rng = torch.get_rng_state()
    backbone_training_bytes(backbone, (4, 3, 112, 112))
    assert not backbone.training
    assert all(torch.equal(state[name], tensor) for name, tensor in backbone.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())


def test_a_compiled_backbone_is_measured_eagerly():
    """model.compile compiles the backbone in place before the head is planned; inductor cannot compile
    the meta-device forward (found on an H200: training with model.compile on CUDA failed at start)."""
    backbone = small_backbone()
    eager = backbone_training_bytes(backbone, (4, 3, 112, 112))
    backbone.compile()
    assert backbone_training_bytes(backbone, (4, 3, 112, 112)) == eager
    assert backbone_training_bytes(torch.compile(small_backbone()), (4, 3, 112, 112)) == eager
