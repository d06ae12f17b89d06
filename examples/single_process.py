"""facetrain's sharded margin-softmax head as the classifier of any backbone, in one process.

    python examples/single_process.py --steps 20 [--device cuda]

In one process the head holds every class. examples/ddp.py and examples/fsdp2.py run the same loop on
N processes, each holding 1/N of the classes, and train exactly as this one on the same global batches.
The fake faces and the small backbone below stand in for your data and model; the other examples
import them from here.
"""

import argparse
import itertools

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from facetrain.heads import ShardedMarginHead

CLASSES, EMBEDDING, BATCH = 100, 32, 32  # identities, embedding size, global batch


def fake_faces() -> TensorDataset:
    """200 3 x 16 x 16 "photos" of 100 identities: each a noisy copy of its identity's face."""
    generator = torch.Generator().manual_seed(0)
    faces = torch.randn(CLASSES, 3, 16, 16, generator=generator)
    labels = torch.randint(0, CLASSES, (200,), generator=generator)
    return TensorDataset(faces[labels] + 0.5 * torch.randn(200, 3, 16, 16, generator=generator), labels)


def make_backbone() -> nn.Module:
    """Any module from images to embeddings. Seeded, so every rank starts from the same weights."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 4 * 4, EMBEDDING),
    )  # fmt: skip


def train(steps: int, device="cpu", dtype=torch.float32):
    backbone = make_backbone().to(device, dtype)
    # ArcFace; real face sets use scale 64, this toy learns faster at 16
    head = ShardedMarginHead(CLASSES, EMBEDDING, margin="arcface", scale=16.0).to(device, dtype)
    head.reset_parameters(seed=0)  # the same full weight on any number of ranks
    params = [*backbone.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)
    loader = DataLoader(fake_faces(), batch_size=BATCH)  # a real run shuffles; the last batch is smaller
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
    losses = []
    for step, (images, labels) in zip(range(steps), batches):
        optimizer.zero_grad()
        loss, accuracy = head(backbone(images.to(device, dtype)), labels.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        print(f"step {step}: loss {loss.item():.6f}, accuracy {accuracy.item():.3f}")
    return losses, backbone, head


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    train(args.steps, args.device)
