"""How far the head's bf16-autocast loss and gradients are from fp64 (issue #22, item 5).

Embeddings are drawn near their target class's weight row (target cosines 0.3-0.9, as after some
training), because the logit error of a bf16 GEMM output grows with the logit: at scale 64 a logit
near 50 is rounded to a multiple of 0.25. The fp64 reference is the untiled head run in fp64 on the
same values; every variant's weight holds values exactly representable in its storage dtype, so the
error measured is the arithmetic's, not the inputs' rounding.

    .venv/bin/python tools/head_precision.py --classes 100000 --batch 256

Prints one markdown table: |loss error| and the relative max error of the embedding and weight
gradients (weight gradient only where the variant returns one: the fused optimizer keeps none).
"""

from __future__ import annotations

import argparse
import time

import torch

from facetrain.heads import HeadPlan, ShardedMarginHead

VARIANTS = {
    # name: (tile_classes or None for untiled, weight storage dtype)
    "untiled fp32 weight": (None, torch.float32),
    "tiled fp32 weight": (8192, torch.float32),
    "tiled bf16 weight": (8192, torch.bfloat16),
}


def make_inputs(classes: int, batch: int, dim: int, seed: int, lowest: float = 0.3, spread: float = 0.6):
    """A bf16-representable weight and embeddings whose target cosine is uniform in
    [lowest, lowest + spread] (0.3-0.9 by default): a trained head's regime."""
    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(classes, dim, generator=generator) * 0.01).to(torch.bfloat16).double()
    labels = torch.randint(0, classes, (batch,), generator=generator)
    target = torch.nn.functional.normalize(weight[labels], dim=1)
    noise = torch.nn.functional.normalize(torch.randn(batch, dim, generator=generator).double(), dim=1)
    cosine = lowest + spread * torch.rand(batch, 1, generator=generator).double()
    embeddings = (cosine * target + (1 - cosine**2).sqrt() * noise) * 20.0
    return weight, embeddings, labels


def run_head(weight, embeddings, labels, tile_classes, dtype, autocast: bool):
    plan = HeadPlan("tiled", tile_classes, dtype) if tile_classes else HeadPlan(weight_dtype=dtype)
    head = ShardedMarginHead(weight.shape[0], weight.shape[1], plan=plan)
    with torch.no_grad():
        head.weight.copy_(weight)
    x = embeddings.to(dtype if dtype == torch.float64 else torch.float32).detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = head(x, labels).loss
    loss.backward()
    weight_grad = None if head.weight.grad is None else head.weight.grad.double()
    return loss.item(), x.grad.double(), weight_grad


def relative_max_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value - reference).abs().max() / reference.abs().max()).item()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--classes", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    weight, embeddings, labels = make_inputs(args.classes, args.batch, args.dim, args.seed)
    ref_loss, ref_x_grad, ref_w_grad = run_head(weight, embeddings, labels, None, torch.float64, False)
    print(f"C={args.classes:,} B={args.batch} D={args.dim}, scale 64 arcface, CPU bf16 autocast vs fp64")
    print(f"fp64 loss {ref_loss:.6f}\n")
    print("| variant | loss error | embedding grad rel. max error | weight grad rel. max error | s |")
    print("|---|---|---|---|---|")
    for name, (tile_classes, dtype) in VARIANTS.items():
        start = time.perf_counter()
        loss, x_grad, w_grad = run_head(weight, embeddings, labels, tile_classes, dtype, True)
        seconds = time.perf_counter() - start
        w_error = "-" if w_grad is None else f"{relative_max_error(w_grad, ref_w_grad):.2e}"
        print(
            f"| {name} | {abs(loss - ref_loss):.2e} | {relative_max_error(x_grad, ref_x_grad):.2e} | "
            f"{w_error} | {seconds:.2f} |"
        )


if __name__ == "__main__":
    main()
