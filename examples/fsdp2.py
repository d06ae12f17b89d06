"""The head in a torchrun job whose backbone is sharded with FSDP2's fully_shard.

    torchrun --nproc-per-node 2 examples/fsdp2.py --steps 20                  # CPU ranks, gloo
    torchrun --nproc-per-node 8 examples/fsdp2.py --steps 20 --device cuda    # a GPU a rank, nccl

As with DDP (examples/ddp.py), only the backbone is wrapped and it gets exactly the single-process
gradients: fully_shard averages over the ranks, which the head's default gradient_reduction="mean"
expects. The head's weight is already sharded, by class, so FSDP must not touch it.
"""

import argparse
import gc
import itertools
import os

import torch
import torch.distributed as dist
from single_process import BATCH, CLASSES, EMBEDDING, fake_faces, make_backbone  # your data and model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from facetrain.heads import ShardedMarginHead


def train(steps: int, device="cpu", dtype=torch.float32):
    device = torch.device(device)
    backbone = make_backbone().to(device, dtype)  # the same seed on every rank: FSDP does not broadcast
    # A large model shards each block first (fully_shard(block) for each), then the whole
    fully_shard(backbone, mesh=init_device_mesh(device.type, (dist.get_world_size(),)))
    head = ShardedMarginHead(CLASSES, EMBEDDING, margin="arcface", scale=16.0).to(device, dtype)
    head.reset_parameters(seed=0)  # the same full weight on any number of ranks
    params = [*backbone.parameters(), *head.parameters()]  # after fully_shard: its DTensor shards
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4)
    sampler = DistributedSampler(fake_faces(), shuffle=False)  # a real run shuffles (and set_epoch)
    loader = DataLoader(sampler.dataset, batch_size=BATCH // dist.get_world_size(), sampler=sampler)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
    losses = []
    for step, (images, labels) in zip(range(steps), batches):
        optimizer.zero_grad()
        loss, accuracy = head(backbone(images.to(device, dtype)), labels.to(device))
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
