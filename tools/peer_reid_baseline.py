"""The re-id peer at equal wall time: what a PyTorch user writes instead of facetrain, scored by the
same evaluation.

torchvision's resnet18 from random weights (its 512-d pooled features as the embedding), a linear
cross-entropy classifier over the training identities plus pytorch-metric-learning's
`TripletMarginLoss` (margin 0.3) on the features with its `BatchHardMiner`, PK batches from its
`MPerClassSampler` (4 images an identity), Adam with linear warmup then cosine decay laid over the
wall-time budget, and the usual re-id augmentation in torchvision (flip, pad-and-crop, random
erasing). One process with all of the machine's cores. It trains on the same CUHK03 `train` folder
for `--seconds`, then facetrain's own evaluation scores it on `val` (query: camera A, gallery:
camera B, flip-summed features, same-camera matches removed; with and without re-ranking), so its
figures sit beside tools/ablate_reid.py's.

    .venv/bin/python tools/peer_reid_baseline.py --seconds 1200 --seeds 0 1 2

pytorch-metric-learning is not a facetrain dependency: `pip install pytorch-metric-learning`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_baseline import train_within  # noqa: E402
from protocol import REPO, SHARED_DATA, append_row, summarize  # noqa: E402

from facetrain.data.decode import decode_image  # noqa: E402
from facetrain.data.reid_images import scan_reid_train  # noqa: E402
from facetrain.eval.embedding import EmbedSettings  # noqa: E402
from facetrain.eval.rerank import RerankSettings  # noqa: E402
from facetrain.eval.retrieval import evaluate_reid  # noqa: E402

METRICS = ["rank1", "rank5", "mAP", "rank1_rerank", "mAP_rerank"]


class ReidImages(Dataset):
    def __init__(self, paths: list[str], labels: np.ndarray, image_size: tuple[int, int]):
        self.paths, self.labels = paths, labels
        self.transform = v2.Compose([
            v2.Resize(image_size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.Pad(image_size[0] // 16),
            v2.RandomCrop(image_size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5] * 3, [0.5] * 3),
            v2.RandomErasing(p=0.5, scale=(0.02, 0.4), value=0.0),
        ])  # fmt: skip

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        image = torch.from_numpy(decode_image(self.paths[index])).permute(2, 0, 1)
        return self.transform(image), int(self.labels[index])


def train_peer(train: Path, args: argparse.Namespace, seed: int) -> tuple[nn.Module, dict]:
    try:
        from pytorch_metric_learning.losses import TripletMarginLoss
        from pytorch_metric_learning.miners import BatchHardMiner
        from pytorch_metric_learning.samplers import MPerClassSampler
    except ImportError:
        sys.exit("the peer needs pytorch-metric-learning: pip install pytorch-metric-learning")

    torch.manual_seed(seed)
    np.random.seed(seed)
    table = scan_reid_train(train)
    paths = [table.reader.name(i) for i in range(len(table.labels))]
    dataset = ReidImages(paths, table.labels, tuple(args.image_size))
    sampler = MPerClassSampler(
        table.labels, m=4, batch_size=args.batch_size, length_before_new_iter=len(paths)
    )
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True,
        num_workers=args.workers, persistent_workers=args.workers > 0,
    )  # fmt: skip
    model = torchvision.models.resnet18(weights=None)
    model.fc = nn.Identity()
    classifier = nn.Linear(512, len(table.class_names))
    triplet, miner = TripletMarginLoss(margin=0.3), BatchHardMiner()
    cross_entropy = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(
        [*model.parameters(), *classifier.parameters()], lr=args.lr, weight_decay=5e-4
    )

    def loss_fn(features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cross_entropy(classifier(features), labels) + triplet(
            features, labels, miner(features, labels)
        )

    return train_within(model, loss_fn, optimizer, loader, args.seconds, args.warmup_steps)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, required=True, help="training wall-time budget")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--data", type=Path, default=SHARED_DATA / "cuhk03", help="a folder with train/ and val/"
    )
    parser.add_argument("--image-size", type=int, nargs=2, default=[128, 64], metavar=("HEIGHT", "WIDTH"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "peer_reid")
    args = parser.parse_args()
    val = args.data.resolve() / "val"
    rows = []
    for seed in args.seeds:
        model, trained = train_peer(args.data.resolve() / "train", args, seed)
        scored = {
            suffix: evaluate_reid(
                model, f"{val}@1", f"{val}@2", EmbedSettings(tuple(args.image_size), progress=False), rerank
            ).as_dict()
            for suffix, rerank in (("", None), ("_rerank", RerankSettings()))
        }
        row = {"seed": seed, **trained}
        row |= {"rank1": scored[""]["rank1"], "rank5": scored[""]["rank5"], "mAP": scored[""]["mAP"]}
        row |= {"rank1_rerank": scored["_rerank"]["rank1"], "mAP_rerank": scored["_rerank"]["mAP"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    figures = summarize("peer_reid", rows, METRICS, f"seeds {args.seeds}")
    args.out.mkdir(parents=True, exist_ok=True)
    append_row(
        args.out / "rows.jsonl",
        {"name": "peer_reid", "seconds": args.seconds, "figures": figures, "runs": rows},
    )


if __name__ == "__main__":
    main()
