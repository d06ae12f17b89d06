"""A timm model as the backbone, the head as its classifier, under torchrun and plain DDP.

    python examples/timm_backbone.py --steps 20                         # one process
    torchrun --nproc-per-node 2 examples/timm_backbone.py --steps 20    # DDP, gloo

timm's `num_classes` becomes the embedding size: the model's own classifier layer turns into the
embedding layer, and the head does the classifying. Without timm installed this prints one line and
exits 0 (pip install timm).
"""

import argparse
import gc
import itertools
import os
import sys

import torch
import torch.distributed as dist
from single_process import BATCH, CLASSES, EMBEDDING, fake_faces  # your data
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from facetrain.heads import ShardedMarginHead


def train(steps: int, device="cpu", dtype=torch.float32):
    import timm

    torch.manual_seed(0)  # the same weights on every rank
    # A small ViT on the 16 x 16 fake faces (LayerNorm: exact under DDP; a BatchNorm model's statistics
    # are per rank unless converted with torch.nn.SyncBatchNorm.convert_sync_batchnorm)
    backbone = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, depth=2, num_classes=EMBEDDING
    ).to(device, dtype)
    model = DistributedDataParallel(backbone) if dist.is_initialized() else backbone
    head = ShardedMarginHead(CLASSES, EMBEDDING, margin="arcface", scale=16.0).to(device, dtype)
    head.reset_parameters(seed=0)  # the same full weight on any number of ranks
    params = [*model.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)
    ranks, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_initialized() else (1, 0)
    sampler = DistributedSampler(fake_faces(), ranks, rank, shuffle=False)  # a real run shuffles
    loader = DataLoader(sampler.dataset, batch_size=BATCH // ranks, sampler=sampler)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch
    losses = []
    for step, (images, labels) in zip(range(steps), batches):
        optimizer.zero_grad()
        loss, accuracy = head(model(images.to(device, dtype)), labels.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f}, accuracy {accuracy.item():.3f}")
    return losses, backbone, head


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl)")
    args = parser.parse_args()
    try:
        import timm  # noqa: F401
    except ImportError:
        print("timm is not installed, so this example has nothing to run: pip install timm")
        sys.exit(0)
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
