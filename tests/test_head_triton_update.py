"""FusedSGD's single-pass Triton update (`heads/triton_update.py`) equals its torch update.

On the CPU through Triton's interpreter (tests/conftest.py), compiled on a GPU under `pytest -m cuda`.
Tiles of 10 rows over 23 classes (a remainder of 3) in blocks of 4 rows, D = 37 under a block of 64;
momentum 0 and 0.9, weight decay, every row or Partial FC's sorted index. After three steps the weight
and momentum buffer equal the torch path's to 1e-6 of their largest magnitude (measured: 6e-8 on the
CPU); through the whole head, the Triton tiles with the single pass equal the torch tiles to 1e-5.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.heads.class_rows import class_tiles
from facetrain.heads.fused_optim import FusedAdamW, FusedSGD
from tests.support.head_problems import make_problem
from tests.support.triton_cases import DEVICES, EXACT, relative_error

pytest.importorskip("triton")

CLASSES, DIM, TILE, STEPS = 23, 37, 10, 3
UPDATE_EXACT = 1e-6


@pytest.fixture(scope="module")
def update_kernel():
    """The kernel module: interpreted where there is no GPU (tests/conftest.py sets TRITON_INTERPRET)."""
    import facetrain.heads.triton_update as module

    return module


@pytest.fixture(params=DEVICES)
def device(request, update_kernel):
    if request.param == "cpu" and not update_kernel.INTERPRETED:
        pytest.skip("Triton was compiled for the GPU in this process; the CPU cases need its interpreter")
    return torch.device(request.param)


def updated(device, single_pass, momentum, weight_decay, index):
    """The weight and buffer after `STEPS` tile-by-tile updates with seeded raw gradients."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.nn.Parameter(torch.randn(CLASSES, DIM, generator=generator).to(device))
    optimizer = FusedSGD([weight], lr=0.1, momentum=momentum, weight_decay=weight_decay)
    width = CLASSES if index is None else len(index)
    index = None if index is None else torch.tensor(index, device=device)
    for _ in range(STEPS):
        with torch.no_grad():
            rows_all = weight if index is None else weight[index]
            inv_norms = rows_all.norm(dim=1).reciprocal()
            for rows in class_tiles(width, TILE, index):
                raw_grad = torch.randn(len(rows), DIM, generator=generator).to(device)
                inv_norm = inv_norms[rows.start : rows.stop]
                if single_pass:
                    assert optimizer.single_pass_update(weight, rows, raw_grad, inv_norm)
                    continue
                current = rows.read(weight, torch.float32)
                radial = (raw_grad * current).sum(dim=1) * inv_norm.square()
                optimizer.update(weight, rows, current, raw_grad, radial)
    buffers = list(optimizer.state[weight].values())
    return [weight.detach().cpu(), *[buffer.cpu() for buffer in buffers]]


@pytest.mark.parametrize("index", [None, [0, 2, 3, 5, 8, 9, 11, 12, 13, 17, 20, 22]])
@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.0, 5e-4), (0.9, 5e-4)])
def test_single_pass_equals_the_torch_update(device, momentum, weight_decay, index):
    got = updated(device, True, momentum, weight_decay, index)
    expected = updated(device, False, momentum, weight_decay, index)
    assert len(got) == len(expected) == (2 if momentum else 1)
    for actual, reference in zip(got, expected):
        assert relative_error(actual, reference) <= UPDATE_EXACT
    if index is not None:  # rows Partial FC did not keep are untouched
        untouched = sorted(set(range(CLASSES)) - set(index))
        initial = torch.randn(CLASSES, DIM, generator=torch.Generator().manual_seed(3))
        assert torch.equal(got[0][untouched], initial[untouched])


def test_bf16_storage_and_adamw_keep_the_torch_update(device):
    weight = torch.nn.Parameter(torch.randn(CLASSES, DIM, device=device))
    rows, raw_grad = class_tiles(CLASSES, TILE)[0], torch.randn(TILE, DIM, device=device)
    inv_norm = torch.ones(TILE, device=device)
    bf16 = torch.nn.Parameter(weight.detach().to(torch.bfloat16))
    assert not FusedSGD([bf16], lr=0.1, state_dtype=torch.bfloat16).single_pass_update(
        bf16, rows, raw_grad, inv_norm
    )
    assert not FusedAdamW([weight], lr=0.1).single_pass_update(weight, rows, raw_grad, inv_norm)
    assert torch.equal(bf16, weight.detach().to(torch.bfloat16))


def head_steps(kernel, device, momentum, sample_rate):
    """Two steps of the tiled head with a fused SGD: the weight and its state."""
    weight, embeddings, labels = make_problem("spread", torch.float32, CLASSES, 19)
    plan = HeadPlan("tiled", TILE, fused_optimizer=True, kernel=kernel)
    head = ShardedMarginHead(CLASSES, weight.shape[1], sample_rate=sample_rate, plan=plan).to(device)
    with torch.no_grad():
        head.weight.copy_(weight)
    optimizer = FusedSGD([head.weight], lr=0.1, momentum=momentum, weight_decay=5e-4)
    head.fuse_optimizer(optimizer)
    torch.manual_seed(1)  # Partial FC's draws, alike for both kernels
    for _ in range(2):
        head(embeddings.to(device), labels.to(device)).loss.backward()
    return [head.weight.detach().cpu(), *[value.cpu() for value in optimizer.state[head.weight].values()]]


@pytest.mark.parametrize("sample_rate", [1.0, 0.5])
def test_the_triton_head_runs_the_single_pass(device, sample_rate, monkeypatch, update_kernel):
    """Momentum 0 here (test_head_triton.py covers 0.9 through the head); each tile took the single pass."""
    calls = []
    sgd_rows = update_kernel.sgd_rows
    monkeypatch.setattr(update_kernel, "sgd_rows", lambda *args: calls.append(1) or sgd_rows(*args))
    triton = head_steps("triton", device, 0.0, sample_rate)
    assert len(calls) >= 4  # two steps of at least two tiles
    torch_tiles = head_steps("torch", device, 0.0, sample_rate)
    assert len(triton) == len(torch_tiles) == 1
    assert relative_error(triton[0], torch_tiles[0]) <= EXACT


def compile_for_hopper() -> None:
    """Compile the kernel for sm_90 at D = 512 with the GPU's block of rows; prints its shared memory and
    whether its PTX spills to local memory. Run without TRITON_INTERPRET."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import facetrain.heads.triton_update as kernels

    block_d = 512
    signature = dict.fromkeys(["weight_ptr", "buffer_ptr", "grad_ptr", "inv_norm_ptr"], "*fp32")
    signature |= {"index_ptr": "*i64"} | dict.fromkeys(["t", "D", "start"], "i32")
    signature |= dict.fromkeys(["lr", "momentum", "weight_decay"], "fp32")
    signature |= dict.fromkeys(["stride_w", "stride_g"], "i32")
    signature |= {"stream_ptr": "*bf16", "stream_norm_ptr": "*fp32"}  # the head's bf16 copy (row_stream.py)
    constants = {"HAS_INDEX": True, "HAS_MOMENTUM": True, "STREAM": True}
    constants["BLOCK_R"] = kernels.ROW_ELEMENTS // block_d
    constants["BLOCK_D"] = block_d
    kernel = kernels._sgd_rows_kernel
    names = kernel.arg_names
    signature = {name: signature.get(name, "constexpr") for name in names}
    places = {(names.index(name),): value for name, value in constants.items()}
    compiled = triton.compile(
        ASTSource(kernel, signature, constexprs=places), target=GPUTarget("cuda", 90, 32),
        options={"num_warps": 4},
    )  # fmt: skip
    print(compiled.metadata.shared, ".local" in compiled.asm["ptx"])


def test_kernel_compiles_for_hopper():
    """What the interpreter cannot show: the kernel compiles for an H100/H200 without a GPU, needs no
    shared memory past the 227 KiB a block and keeps its rows out of local memory."""
    environment = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    call = "from tests.test_head_triton_update import compile_for_hopper; compile_for_hopper()"
    result = subprocess.run(
        [sys.executable, "-c", call], cwd=Path(__file__).parents[1], env=environment,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    shared, spills = result.stdout.split()
    assert int(shared) <= 227 * 1024 and spills == "False", result.stdout
