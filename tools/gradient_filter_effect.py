"""What `head.gradient_filter` costs in gradient and in loss (issue #56, item 3), on the torch tiles.

`gradient`: one tiled step with the filter at each threshold against the same step without it, at a few
(C, B, D): the relative error of dX and dW (Frobenius norms of the difference over those of the exact
gradients) and the share of gradient blocks skipped. Two states of the head: a random start (every
probability near 1/C) and a trained-like one (each embedding at cosine `--target-cos` to its class's
row, so the softmax sits on the targets).

`train`: a short training run, the same seed and data with the filter off and on: a two-layer backbone
over synthetic classes (each a random centre in R^64, samples the centre plus noise), the tiled head
(CosFace m 0.3, s 30, as configs/demo.yaml) with its fused SGD. Prints the mean loss over windows of
steps, the top-1 hits of the last window and the mean step time.

    .venv/bin/python tools/gradient_filter_effect.py gradient
    .venv/bin/python tools/gradient_filter_effect.py train --classes 16384 --steps 300
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

import facetrain.heads.tile_kernel as tile_kernel
from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.heads.fused_optim import FusedSGD
from facetrain.heads.gradient_filter import CCE_DEFAULT, filter_blocks_

THRESHOLDS = (CCE_DEFAULT, 1e-3, 1e-2)
SIZES = ((8192, 256, 128), (65536, 256, 128), (65536, 256, 512))


class BlockCount:
    """Counts the blocks the torch tiles keep and skip (wraps `gradient_filter.filter_blocks_`)."""

    def __init__(self):
        self.kept = self.total = 0

    def __call__(self, values, limits, block):
        kept = filter_blocks_(values, limits, block)
        self.kept += int(kept.sum())
        self.total += kept.numel()
        return kept


def one_step(weight, embeddings, labels, threshold, tile):
    count = BlockCount()
    tile_kernel.filter_blocks_ = count
    head = ShardedMarginHead(*weight.shape, plan=HeadPlan("tiled", tile, gradient_filter=threshold))
    with torch.no_grad():
        head.weight.copy_(weight)
    x = embeddings.clone().requires_grad_()
    loss = head(x, labels).loss
    loss.backward()
    tile_kernel.filter_blocks_ = filter_blocks_
    return float(loss.detach()), x.grad, head.weight.grad, 1 - count.kept / max(count.total, 1)


def relative(got, exact):
    return float((got - exact).norm() / exact.norm())


def gradient(args):
    generator = torch.Generator().manual_seed(0)
    for classes, batch, dim in SIZES:
        weight = torch.randn(classes, dim, generator=generator) * 0.01
        labels = torch.randint(0, classes, (batch,), generator=generator)
        noise = torch.nn.functional.normalize(torch.randn(batch, dim, generator=generator), dim=1)
        rows = torch.nn.functional.normalize(weight[labels], dim=1)
        aside = torch.nn.functional.normalize(noise - (noise * rows).sum(1, keepdim=True) * rows, dim=1)
        cos = args.target_cos
        states = {
            "random start": noise * 5.0,
            f"targets at cos {cos}": (cos * rows + (1 - cos**2) ** 0.5 * aside) * 5.0,
        }
        for state, embeddings in states.items():
            exact = one_step(weight, embeddings, labels, 0.0, args.tile)
            for threshold in THRESHOLDS:
                loss, grad_x, grad_w, skipped = one_step(weight, embeddings, labels, threshold, args.tile)
                print(json.dumps({
                    "C": classes, "B": batch, "D": dim, "state": state, "threshold": threshold,
                    "blocks_skipped": round(skipped, 4), "loss_equal": loss == exact[0],
                    "dX_relative_error": relative(grad_x, exact[1]), "dW_relative_error": relative(grad_w, exact[2]),
                }))  # fmt: skip


def train_run(args, threshold):
    generator = torch.Generator().manual_seed(args.seed)
    centres = torch.randn(args.classes, 64, generator=generator)
    torch.manual_seed(args.seed)
    backbone = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, args.dim))
    plan = HeadPlan("tiled", args.tile, fused_optimizer=True, gradient_filter=threshold)
    head = ShardedMarginHead(args.classes, args.dim, margin="cosface", scale=30.0, plan=plan, m=0.3)
    head.reset_parameters(seed=args.seed)
    head.fuse_optimizer(FusedSGD([head.weight], lr=args.lr, momentum=0.9, weight_decay=5e-4))
    optimizer = torch.optim.SGD(backbone.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    losses, hits, seconds = [], [], 0.0
    for _ in range(args.steps):
        labels = torch.randint(0, args.classes, (args.batch,), generator=generator)
        inputs = centres[labels] + args.noise * torch.randn(args.batch, 64, generator=generator)
        start = time.perf_counter()
        loss, accuracy = head(backbone(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds += time.perf_counter() - start
        losses.append(float(loss.detach()))
        hits.append(float(accuracy))
    window = args.steps // 6
    return {
        "threshold": threshold,
        "loss_by_window": [
            round(sum(losses[i : i + window]) / window, 4) for i in range(0, args.steps, window)
        ],
        "last_window_top1": round(sum(hits[-window:]) / window, 4),
        "step_ms": round(1000 * seconds / args.steps, 1),
    }


def train(args):
    for threshold in (0.0, *args.thresholds):
        print(json.dumps(train_run(args, threshold)))


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("gradient")
    measure.add_argument("--target-cos", type=float, default=0.6)
    measure.add_argument("--tile", type=int, default=8192)
    run = commands.add_parser("train")
    run.add_argument("--classes", type=int, default=16384)
    run.add_argument("--batch", type=int, default=256)
    run.add_argument("--dim", type=int, default=128)
    run.add_argument("--steps", type=int, default=300)
    run.add_argument("--tile", type=int, default=8192)
    run.add_argument("--lr", type=float, default=0.1)
    run.add_argument("--noise", type=float, default=0.5)
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--thresholds", type=float, nargs="+", default=[CCE_DEFAULT])
    args = parser.parse_args()
    gradient(args) if args.command == "gradient" else train(args)


if __name__ == "__main__":
    main()
