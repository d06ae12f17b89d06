"""The peer at equal budget: what a PyTorch user writes instead of facetrain, scored by the same protocol.

torchvision's resnet18 from random weights with a 128-d embedding layer, pytorch-metric-learning's
`ArcFaceLoss` (its own class weights, margin 28.6 degrees = 0.5 rad, scale 64), SGD with momentum,
linear warmup then cosine decay, horizontal flip and random resized crop, one process with all of
the machine's cores. It trains on exactly the data facetrain's protocol tools train on (an LFW-dev
fold's outside people, or ORL s1-s30) for a wall-time budget: every ten steps the schedule is laid
anew over as many steps as fit in `--seconds` at the speed measured so far. Verification is facetrain's own (the same
pairs, flip-summed embeddings, 10 stratified folds), so the figures sit beside docs/accuracy.md's.

    .venv/bin/python tools/peer_baseline.py lfw --fold 2 --seeds 0 1 --seconds 1200
    .venv/bin/python tools/peer_baseline.py orl --seeds 0 1 2 --seconds 80
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablate_lfw import VIEW2_PAIRS, write_fold_split  # noqa: E402
from ablate_orl import ORL, write_orl_split  # noqa: E402
from protocol import REPO, append_row, summarize  # noqa: E402

from facetrain.data.decode import decode_image  # noqa: E402
from facetrain.eval.verify_pairs import EmbedSettings, load_pairs, verify  # noqa: E402

TIMED_STEPS = 10


class ListDataset(Dataset):
    """`path,label` rows, decoded by OpenCV to RGB uint8 and resized, as tensors in [-1, 1]."""

    def __init__(self, list_csv: Path, image_size: int, train: bool):
        with list_csv.open() as handle:
            rows = list(csv.DictReader(handle))
        self.paths = [row["path"] for row in rows]
        self.labels = [int(row["label"]) for row in rows]
        steps = [v2.Resize((image_size, image_size), antialias=True)]
        if train:
            steps = [
                v2.RandomResizedCrop((image_size, image_size), scale=(0.8, 1.0), antialias=True),
                v2.RandomHorizontalFlip(),
            ]
        self.transform = v2.Compose(
            [*steps, v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.5] * 3)]
        )

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        image = torch.from_numpy(decode_image(self.paths[index])).permute(2, 0, 1)
        return self.transform(image), self.labels[index]


def build_model(embedding_size: int) -> nn.Module:
    model = torchvision.models.resnet18(weights=None)
    model.fc = nn.Sequential(nn.Linear(model.fc.in_features, embedding_size), nn.BatchNorm1d(embedding_size))
    return model


def train_peer(list_csv: Path, seconds: float, args: argparse.Namespace, seed: int) -> tuple[nn.Module, dict]:
    from pytorch_metric_learning.losses import ArcFaceLoss

    torch.manual_seed(seed)
    np.random.seed(seed)
    dataset = ListDataset(list_csv, args.image_size, train=True)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
        num_workers=args.workers, persistent_workers=args.workers > 0,
    )  # fmt: skip
    model = build_model(args.embedding_size)
    loss_fn = ArcFaceLoss(num_classes=max(dataset.labels) + 1, embedding_size=args.embedding_size)
    optimizer = torch.optim.SGD(
        [*model.parameters(), *loss_fn.parameters()], lr=args.lr, momentum=0.9, weight_decay=5e-4
    )
    return train_within(model, loss_fn, optimizer, loader, seconds, args.warmup_steps)


def train_within(
    model: nn.Module,
    loss_fn,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    seconds: float,
    warmup: int,
) -> tuple[nn.Module, dict]:
    """Train for a wall-time budget as a PyTorch user would: linear warmup, then cosine decay laid over
    the steps the budget holds, re-estimated from the measured speed every TIMED_STEPS steps.
    `loss_fn(model(images), labels)` is the loss; the peers of tools/ differ only in it."""
    total_steps = None  # known once the first steps are timed

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if total_steps is None:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    step, started, losses = 0, time.perf_counter(), []
    while total_steps is None or step < total_steps:
        for images, labels in loader:
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            step += 1
            if step % TIMED_STEPS == 0:  # the machine's speed may change: lay the schedule anew
                spent = time.perf_counter() - started
                total_steps = max(step + 1, int(seconds * step / spent))
                if step == TIMED_STEPS:
                    print(f"peer: {spent / step:.2f} s a step, ~{total_steps} steps fit in {seconds:.0f} s")
            if total_steps is not None and step >= total_steps:
                break
    elapsed = time.perf_counter() - started
    return model.eval(), {"steps": step, "train_s": elapsed, "final_loss": float(np.mean(losses[-20:]))}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dataset", choices=["lfw", "orl"])
    parser.add_argument("--fold", type=int, default=2, help="LFW View 2 fold to verify (2-10)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--seconds", type=float, required=True, help="training wall-time budget")
    parser.add_argument("--lfw", type=Path, default=REPO / "runs" / "lfw_dev_aligned")
    parser.add_argument("--orl", type=Path, default=ORL)
    parser.add_argument("--min-photos", type=int, default=2, help="LFW: as tools/ablate_lfw.py --min-photos")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--embedding-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "peer_baseline")
    args = parser.parse_args()
    if args.dataset == "lfw":
        if not 2 <= args.fold <= 10:
            sys.exit("--fold: folds 2-10 are for development (fold 1 is held out)")
        train_list, pairs = write_fold_split(
            args.lfw.resolve(), VIEW2_PAIRS, args.fold, args.min_photos, args.out / "splits"
        )
    else:
        train_list, pairs, _ = write_orl_split(args.orl.resolve(), args.out / "splits_orl")
    rows = []
    for seed in args.seeds:
        model, trained = train_peer(train_list, args.seconds, args, seed)
        settings = EmbedSettings((args.image_size, args.image_size), progress=False)
        result = verify(load_pairs(pairs), model, settings)
        figures = result.as_dict()
        row = {
            "seed": seed,
            **trained,
            "accuracy": figures["accuracy"],
            "auc": figures["auc"],
            "tar_far_1e-2": figures.get("tar_at_far", {}).get("0.01"),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    name = f"peer_{args.dataset}" + (f"_fold{args.fold}" if args.dataset == "lfw" else "")
    figures = summarize(name, rows, ["accuracy", "auc", "tar_far_1e-2"], f"seeds {args.seeds}")
    args.out.mkdir(parents=True, exist_ok=True)
    append_row(
        args.out / "rows.jsonl", {"name": name, "seconds": args.seconds, "figures": figures, "runs": rows}
    )


if __name__ == "__main__":
    main()
