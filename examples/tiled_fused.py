"""The tiled head with its fused optimizer and an LR schedule: the mode for millions of classes.

    python examples/tiled_fused.py --steps 20                              # one process
    torchrun --nproc-per-node 2 examples/tiled_fused.py --steps 20         # DDP backbone, gloo

The tiled head computes the logits tile_classes classes at a time, and its fused optimizer updates each
tile's rows inside the backward, as soon as their gradient exists: no classes x dims gradient is ever
allocated and head.weight.grad stays None. The fused optimizer is a torch.optim.Optimizer: an LR
scheduler drives it like the backbone's. Same loss and gradients as the untiled head (docs/head.md, "Modes").
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

from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.heads.fused_optim import FusedSGD


def train(steps: int, device="cpu", dtype=torch.float32):
    backbone = make_backbone().to(device, dtype)
    model = DistributedDataParallel(backbone) if dist.is_initialized() else backbone
    plan = HeadPlan("tiled", tile_classes=16, fused_optimizer=True)  # 16 classes a tile, its own optimizer
    head = ShardedMarginHead(CLASSES, EMBEDDING, margin="arcface", scale=16.0, plan=plan)
    head.reset_parameters(seed=0)  # the same full weight on any number of ranks
    head.to(device, dtype)
    # A torch.optim.Optimizer over this rank's rows with torch.optim.SGD's arithmetic, applied inside the
    # backward: its step() has nothing left to do, schedulers and state_dict work as usual.
    head_optimizer = FusedSGD([head.weight], lr=0.1, weight_decay=5e-4, momentum=0.9)
    head.fuse_optimizer(head_optimizer)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    schedulers = [
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=steps) for o in (optimizer, head_optimizer)
    ]
    ranks, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    sampler = DistributedSampler(fake_faces(), ranks, rank, shuffle=False)  # a real run shuffles
    loader = DataLoader(sampler.dataset, batch_size=BATCH // ranks, sampler=sampler)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
    losses = []
    for step, (images, labels) in zip(range(steps), batches):
        optimizer.zero_grad()
        loss, accuracy = head(model(images.to(device, dtype)), labels.to(device))
        loss.backward()  # updates the head's weight and momentum, at head_optimizer's current rate
        optimizer.step()  # updates the backbone
        head_optimizer.step()  # nothing to do; kept so the loop reads like any other
        for scheduler in schedulers:
            scheduler.step()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f}, accuracy {accuracy.item():.3f}")
    return losses, backbone, head


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl)")
    args = parser.parse_args()
    launched = "LOCAL_RANK" in os.environ  # by torchrun
    device = torch.device(
        args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if launched:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    train(args.steps, device)
    if launched:
        gc.collect()  # free the wrapper (held in reference cycles) first, or gloo may abort at exit
        dist.destroy_process_group()
