"""The head in a torchrun job whose backbone is wrapped in plain DistributedDataParallel.

    torchrun --nproc-per-node 2 examples/ddp.py --steps 20                  # CPU ranks, gloo
    torchrun --nproc-per-node 8 examples/ddp.py --steps 20 --device cuda    # a GPU a rank, nccl

Only the backbone is wrapped: the head's weight is a different shard of the classes on each rank, so
DDP must not average it. The loss is the mean over the global batch (every rank's rows), the same on
every rank, and the backbone's gradients after DDP's average are exactly those of one process on that
batch: this trains as examples/single_process.py does.
"""

import argparse
import gc
import itertools
import os

import torch
import torch.distributed as dist
from single_process import BATCH, CLASSES, EMBEDDING, fake_faces, make_backbone  # your data and model
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from facetrain.heads import ShardedMarginHead


def train(steps: int, device="cpu", dtype=torch.float32):
    backbone = make_backbone().to(device, dtype)
    model = DistributedDataParallel(backbone)
    # Each rank holds classes [head.class_start, head.class_start + head.class_count)
    head = ShardedMarginHead(CLASSES, EMBEDDING, margin="arcface", scale=16.0).to(device, dtype)
    head.reset_parameters(seed=0)  # the same full weight on any number of ranks
    params = [*model.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)
    # Each rank reads its part of every global batch; the last batch is smaller, and may be uneven
    sampler = DistributedSampler(fake_faces(), shuffle=False)  # a real run shuffles (and set_epoch)
    loader = DataLoader(sampler.dataset, batch_size=BATCH // dist.get_world_size(), sampler=sampler)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
    losses = []
    for step, (images, labels) in zip(range(steps), batches):
        optimizer.zero_grad()
        loss, accuracy = head(model(images.to(device, dtype)), labels.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # the global batch's loss and accuracy, the same on every rank
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.6f}, accuracy {accuracy.item():.3f}")
    return losses, backbone, head


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl)")
    args = parser.parse_args()
    device = torch.device(args.device, int(os.environ["LOCAL_RANK"]) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    train(args.steps, device)
    gc.collect()  # free the wrapper (held in reference cycles) first, or gloo may abort at exit
    dist.destroy_process_group()
