"""`head.kernel: triton`: the Triton tile kernels compute what the torch tiles and the dense head compute
(issue #40, item 2).

On the CPU through Triton's interpreter (TRITON_INTERPRET=1, which tests/conftest.py sets before
anything imports triton); the same checks run compiled on a GPU under `pytest -m cuda`.
Shapes are tiny and uneven: 19 rows over blocks of 16, tiles of 20 classes over blocks of 16 and a
remainder tile of 10, D = 12 under a block of 16, two ranks with shards of 12 and 11 classes.
fp32 equals the torch tiles and the dense head to 1e-5 relative (loss, dX, dW; weights and optimizer
state after fused SGD / AdamW steps, Partial FC's gathered rows included). Under bf16 autocast the
loss equals the fp64 loss of the bf16-rounded operands to 2e-5 (test_head_precision's bound), and the
gradients are within test_cuda.py's bf16 bound of fp64, as the torch tiles' are (measured: 6e-3 and 9e-3
of dX and dW, against 2e-3 and 3e-3 for the torch tiles, whose CPU GEMM may leave its operands
unrounded where Triton rounds both to bf16, as a GPU does). Without a GPU the bf16 kernels are also
compiled for Hopper (sm_90), which the interpreter never does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from facetrain.errors import FacetrainError
from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.heads import margin_softmax as ms
from facetrain.heads.fused_optim import FusedAdamW, FusedSGD
from facetrain.heads.kernel_choice import resolve_kernel
from facetrain.heads.tile_kernel import EAGER_TILE_OPS
from facetrain.parallel.dims import init_parallel
from facetrain.train.head_plan import describe_plan, resolve_head_plan
from facetrain.train.run_config import Config
from tests.support.distributed import run_distributed
from tests.support.head_problems import DISTINCT_MARGINS, dense_reference, local_rows, make_problem
from tests.support.triton_cases import DEVICES, EXACT, relative_error

pytest.importorskip("triton")

CLASSES, BATCH, TILE = 50, 19, 20
LOSS_BOUND = 2e-5  # tests/test_head_precision.py
GRADIENT_BF16 = 6e-2  # tests/test_cuda.py's bf16 bound; measured here 6e-3 (Triton), 2e-3 (torch tiles)
OPTIMIZERS = {
    "sgd": (FusedSGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}),
    "adamw": (FusedAdamW, {"lr": 0.01, "weight_decay": 0.05, "betas": (0.9, 0.99)}),
}


@pytest.fixture(scope="module")
def kernels():
    """The kernel module: interpreted where there is no GPU (tests/conftest.py sets TRITON_INTERPRET)."""
    import facetrain.heads.triton_tile as module

    return module


@pytest.fixture(params=DEVICES)
def device(request, kernels):
    if request.param == "cpu" and not kernels.INTERPRETED:
        pytest.skip("Triton was compiled for the GPU in this process; the CPU cases need its interpreter")
    return torch.device(request.param)


def run_head(kernel, device, weight, embeddings, labels, margin="arcface", optimizer=None, storage=None,
             sample_rate=1.0, steps=1, autocast=False, group=None, rows=slice(None), gradient_filter=0.0):  # fmt: skip
    """`steps` steps of a tiled head: the losses, the last dX, and the weight's gradient (no optimizer)
    or the weight and optimizer state after the fused updates."""
    storage = storage or weight.dtype
    plan = HeadPlan("tiled", TILE, storage, storage, fused_optimizer=optimizer is not None, kernel=kernel,
                    gradient_filter=gradient_filter)  # fmt: skip
    head = ShardedMarginHead(
        weight.shape[0], weight.shape[1], margin=margin, sample_rate=sample_rate, group=group, plan=plan,
        gradient_reduction="sum",
    ).to(device)  # fmt: skip
    with torch.no_grad():
        head.weight.copy_(weight[head.class_start : head.class_stop])
    fused = None
    if optimizer is not None:
        kind, settings = OPTIMIZERS[optimizer]
        fused = kind([head.weight], state_dtype=storage, **settings)
        head.fuse_optimizer(fused)
    torch.manual_seed(1)  # Partial FC's draws and stochastic rounding, alike for both kernels
    losses = []
    for _ in range(steps):
        x = embeddings[rows].to(device).requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = head(x, labels[rows].to(device)).loss
        loss.backward()
        losses.append(loss.detach().cpu())
    state = (
        [] if fused is None else [value.cpu() for value in fused.state[head.weight].values() if value.dim()]
    )
    weight_out = head.weight.grad if fused is None else head.weight.detach()
    return [torch.stack(losses), x.grad.cpu(), weight_out.cpu(), *state]


@pytest.mark.parametrize("margin", DISTINCT_MARGINS)
def test_every_margin_equals_torch_tiles_and_dense(device, margin):
    weight, embeddings, labels = make_problem("spread", torch.float32, CLASSES, BATCH)
    triton = run_head("triton", device, weight, embeddings, labels, margin)
    torch_tiles = run_head("torch", device, weight, embeddings, labels, margin)
    loss, grad_x, grad_w, _ = dense_reference(margin, weight, embeddings, labels)
    for got, tiles, dense in zip(triton, torch_tiles, (loss[None], grad_x, grad_w)):
        assert relative_error(got, tiles) <= EXACT
        assert relative_error(got, dense) <= EXACT


@pytest.mark.parametrize("storage", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sample_rate", [1.0, 0.5])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fused_optimizer_steps_equal_torch_tiles(device, optimizer, sample_rate, storage):
    """Two steps updating inside the backward; with sample_rate 0.5 the kernels gather Partial FC's rows.
    bf16 storage rounds each update stochastically, alike in both (same draws): an element whose
    computed value sits within fp32 rounding of a rounding threshold may land one bf16 step apart."""
    weight, embeddings, labels = make_problem("spread", torch.float32, CLASSES, BATCH)
    arguments = (device, weight, embeddings, labels, "combined", optimizer, storage, sample_rate, 2)
    triton, torch_tiles = run_head("triton", *arguments), run_head("torch", *arguments)
    assert len(triton) == len(torch_tiles) == (4 if optimizer == "sgd" else 5)
    for got, expected in zip(triton, torch_tiles):
        if got.dtype != torch.bfloat16:
            assert relative_error(got, expected) <= EXACT
        else:
            step = expected.abs().float() * 2**-7 + 1e-30  # one bf16 step of each element, at most
            apart = (got.float() - expected.float()).abs()
            assert bool((apart <= step).all()) and float((apart > 0).float().mean()) <= 0.01
    assert not torch.equal(triton[2], weight.to(storage))  # the weight moved


@pytest.mark.parametrize(
    ("margin", "optimizer", "sample_rate"),
    [("arcface", None, 1.0), ("curricularface", None, 0.5), ("magface", "sgd", 1.0), ("cosface", "sgd", 0.5)],
)
def test_gradient_filter_equals_torch_tiles(kernels, device, margin, optimizer, sample_rate):
    """The kernels skip the blocks the torch tiles skip (the interpreter's blocks are theirs), margins'
    modulated negatives, Partial FC's rows and the fused update included; the filter changed the result."""
    if device.type == "cpu":
        assert kernels.TRITON_TILE_OPS.filter_block == EAGER_TILE_OPS.filter_block
    # 200 classes: blocks without a target, which the filter may skip
    weight, embeddings, labels = make_problem("spread", torch.float32, 4 * CLASSES, BATCH)
    arguments = (device, weight, embeddings, labels, margin, optimizer, None, sample_rate)
    triton = run_head("triton", *arguments, gradient_filter=0.1)
    torch_tiles = run_head("torch", *arguments, gradient_filter=0.1)
    unfiltered = run_head("torch", *arguments)
    for got, expected in zip(triton, torch_tiles):
        assert relative_error(got, expected) <= EXACT
    assert min(relative_error(torch_tiles[i], unfiltered[i]) for i in (1, 2)) > 10 * EXACT


def fp64_loss_of_bf16_operands(weight, embeddings, labels, monkeypatch):
    """The untiled head's fp64 loss with the unit embeddings rounded to bf16, as the bf16 GEMM reads them."""
    unit_rows = ms.unit_rows

    def bf16_unit_rows(rows):
        unit, norm = unit_rows(rows)
        return unit.to(torch.bfloat16).to(unit.dtype), norm

    monkeypatch.setattr(ms, "unit_rows", bf16_unit_rows)
    head = ShardedMarginHead(*weight.shape).double()
    with torch.no_grad():
        head.weight.copy_(weight)
    loss = head(embeddings.double(), labels).loss.item()
    monkeypatch.undo()
    return loss


@pytest.mark.parametrize("storage", [torch.float32, torch.bfloat16])
def test_bf16_autocast_is_as_close_as_the_torch_tiles(device, storage, monkeypatch):
    weight, embeddings, labels = make_problem("spread", torch.float32, CLASSES, BATCH)
    weight = weight.to(torch.bfloat16).float()  # the rows the GEMM reads are exact bf16 either way
    triton = run_head("triton", device, weight, embeddings, labels, "arcface", None, storage, autocast=True)
    torch_tiles = run_head(
        "torch", device, weight, embeddings, labels, "arcface", None, storage, autocast=True
    )
    exact = fp64_loss_of_bf16_operands(weight, embeddings, labels, monkeypatch)
    assert abs(float(triton[0]) - exact) <= LOSS_BOUND * exact
    reference = dense_reference("arcface", weight.double(), embeddings.double(), labels)
    for got, tiles, expected in zip(triton[1:], torch_tiles[1:], reference[1:3]):
        assert relative_error(got, expected) <= GRADIENT_BF16
        assert relative_error(tiles, expected) <= GRADIENT_BF16


def sharded_worker(rank, world_size, device_type):
    """Each rank's loss, dX of its rows and dW of its shard, with the Triton tiles."""
    weight, embeddings, labels = make_problem("spread", torch.float32, 23, BATCH, world_size)
    rows = local_rows(world_size, rank, BATCH)
    return run_head("triton", torch.device(device_type), weight, embeddings, labels, "cosface", rows=rows)


def test_two_ranks_equal_the_dense_head(device):
    if device.type == "cuda":
        pytest.skip("gloo workers run the CPU case; one GPU runs the single-rank cases")
    per_rank = run_distributed(sharded_worker, 2, device.type)
    weight, embeddings, labels = make_problem("spread", torch.float32, 23, BATCH, 2)
    loss, grad_x, grad_w, _ = dense_reference("cosface", weight, embeddings, labels)
    for rank_loss, *_ in per_rank:
        assert relative_error(rank_loss, loss[None]) <= EXACT
    assert relative_error(torch.cat([r[1] for r in per_rank]), grad_x) <= EXACT
    assert relative_error(torch.cat([r[2] for r in per_rank]), grad_w) <= EXACT


def test_kernel_choice(monkeypatch):
    assert resolve_kernel("auto", "cpu") == "torch"
    assert resolve_kernel("torch", "cuda") == "torch"
    assert resolve_kernel("auto", "cuda") == "triton"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(FacetrainError, match="head.kernel triton needs CUDA"):
        resolve_kernel("triton", "cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_kernel("triton", "cpu") == "triton"
    with pytest.raises(ValueError, match="kernel"):
        HeadPlan("tiled", kernel="auto")  # a plan carries the resolved kernel
    with pytest.raises(ValueError, match="tiled"):
        HeadPlan(kernel="triton")


def test_the_trainer_resolves_head_kernel_and_logs_it(monkeypatch):
    cfg, dims = Config(), init_parallel()
    cfg.head.mode, cfg.head.tile_classes = "tiled", 5
    plan, reasons = resolve_head_plan(cfg, 12, dims)
    assert plan.kernel == ("triton" if dims.device.type == "cuda" else "torch")  # head.kernel auto
    cfg.head.kernel = "triton"
    plan, reasons = resolve_head_plan(cfg, 12, dims)
    assert "head: tiled, 5 classes a tile, triton kernel, fused sgd" in describe_plan(
        plan, reasons, cfg, 12, dims
    )
    cfg.head.mode = "untiled"
    assert resolve_head_plan(cfg, 12, dims)[0].kernel == "torch"  # the untiled head has no tiles
    if dims.device.type == "cpu":
        cfg.head.mode = "tiled"
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(FacetrainError, match="^head.kernel triton needs CUDA"):
            resolve_head_plan(cfg, 12, dims)


def compile_for_hopper(operand: str, storage: str) -> None:
    """Compile both kernels for sm_90 with the GPU's blocks, printing each one's shared memory and whether
    its dots became wgmma (Hopper's tensor-core instructions). Run without TRITON_INTERPRET."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import facetrain.heads.triton_tile as kernels

    blocks = {name: value for name, value in kernels.BLOCKS.items() if name.startswith("BLOCK")}
    options = {name: value for name, value in kernels.BLOCKS.items() if name.startswith("num_")}
    pointers = {"x_ptr": f"*{operand}", "w_ptr": f"*{storage}", "index_ptr": "*i64", "target_ptr": "*i64"}
    sizes = dict.fromkeys(["B", "T", "D", "tile_start"], "i32") | {"scale": "fp32"}
    modulation = ["threshold_ptr", "linear_ptr", "quadratic_ptr"]  # a margin's modulated negatives
    outputs = {
        kernels._softmax_stats_kernel: ["part_max_ptr", "part_sum_ptr", "target_raw_ptr", *modulation,
                                        "part_plain_ptr"],
        kernels._logit_grad_kernel: ["global_max_ptr", "corrected_ptr", "out_ptr", *modulation, "limit_ptr"],
    }  # fmt: skip
    stats, grad = kernels._softmax_stats_kernel, kernels._logit_grad_kernel
    strides = {stats: ["c_blocks"], grad: ["stride_out", "c_blocks"]}
    filtered = {
        stats: {"NORMS_GIVEN": False},
        grad: {"FILTER": True},
    }  # the gradient filter's test of its blocks
    for kernel, names in outputs.items():
        for modulate in (False, True):
            signature = pointers | {"inv_norm_ptr": "*fp32"} | dict.fromkeys(names, "*fp32")
            signature |= {"out_ptr": f"*{operand}", "kept_ptr": "*i8"} if "out_ptr" in names else {}
            signature |= sizes | dict.fromkeys(["stride_x", "stride_w", *strides[kernel]], "i32")
            constants = {"HAS_INDEX": True, **blocks, "PRECISION": "ieee", "MODULATE": modulate}
            constants |= filtered[kernel]
            signature |= dict.fromkeys(constants, "constexpr")
            places = {(list(signature).index(name),): value for name, value in constants.items()}
            source = ASTSource(kernel, signature, constexprs=places)
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
            print(storage, kernel.__name__, compiled.metadata.shared, "wgmma" in compiled.asm["ptx"])


@pytest.fixture(scope="module")
def hopper_compiles() -> list[list[str]]:
    """Both storage dtypes' compiles in one process (one start of torch and Triton, not two): each line's
    storage, kernel, shared memory and whether its dots became wgmma."""
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    call = "from tests.test_head_triton import compile_for_hopper as c; c('bf16', 'fp32'); c('bf16', 'bf16')"
    result = subprocess.run(
        [sys.executable, "-c", call], cwd=Path(__file__).parents[1], env=environment,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return [line.split() for line in result.stdout.splitlines()]


@pytest.mark.parametrize("storage", ["fp32", "bf16"])
def test_kernels_compile_for_hopper_with_tensor_cores(storage, hopper_compiles):
    """What the interpreter cannot show: the bf16 kernels compile for an H100/H200 (no GPU needed), fit its
    shared memory (227 KiB a block) and run their dots on wgmma, with and without a margin's modulated
    negatives. Compiled once per machine (Triton's cache), about 14 s for each storage dtype."""
    lines = [line for line in hopper_compiles if line[0] == storage]
    for _, name, shared, wgmma in lines:
        assert int(shared) <= 227 * 1024 and wgmma == "True", (name, shared, wgmma)
    assert len(lines) == 4
