"""Where a head step's GPU time goes: torch.profiler over one forward + backward of the untiled head and
the tiled head with torch and with Triton tiles (bf16 autocast, C 1M, B 1024, D 512 by default), the
kernels by total device time.

    python tools/head_profile.py --out head_profile.json            # on a machine with CUDA
    python tools/head_profile.py --device cpu --classes 20000 --out /tmp/p.json   # the same on a CPU

Run by tools/gpu_check.py (part 1); the table it prints is what issue #40's item 3 works from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from facetrain.bench.head_cases import BENCH_HEADS, HeadCase
from facetrain.train.device_defaults import tile_classes

TOP = 15
# what the profile calls each head: the `bench head` kind it builds, so both measure the same head
MODES = {"untiled": "sharded", "tiled": "tiled", "tiled_triton": "tiled_triton"}


def build(mode: str, classes: int, batch: int, dim: int, device: torch.device) -> torch.nn.Module:
    case = HeadCase(MODES[mode], classes, 1, batch, dim, tile_classes(None, device.type), "bf16")
    with device:
        return BENCH_HEADS.build(case.head).build(case)


def profile_step(mode: str, classes: int, batch: int, dim: int, device: torch.device) -> dict:
    head = build(mode, classes, batch, dim, device)
    embeddings = torch.randn(batch, dim, device=device, requires_grad=True)
    labels = torch.randint(0, classes, (batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = head(embeddings, labels).loss
        loss.backward()
        head.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    attribute = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    events = [event for event in profiler.key_averages() if getattr(event, attribute) > 0]
    if device.type == "cuda":  # kernels, not the torch ops that launched them (those would count twice)
        events = [event for event in events if event.device_type == torch.autograd.DeviceType.CUDA]
    events.sort(key=lambda event: getattr(event, attribute), reverse=True)
    total_ms = sum(getattr(event, attribute) for event in events) / 1000
    rows = [
        {"name": event.key[:90], "calls": event.count, "ms": getattr(event, attribute) / 1000}
        for event in events[:TOP]
    ]
    return {"mode": mode, "total_ms": total_ms, "kernels": len(events), "top": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the tables")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=512)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("head_profile: torch sees no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    results = []
    modes = MODES if device.type == "cuda" else ("untiled", "tiled")  # Triton: CUDA (or its interpreter)
    for mode in modes:
        result = profile_step(mode, args.classes, args.batch, args.dim, device)
        results.append(result)
        print(
            f"\n{mode}: {result['total_ms']:.1f} ms of {args.device} time in {result['kernels']} kernels/ops"
        )
        for row in result["top"]:
            print(f"  {row['ms']:8.2f} ms  {row['calls']:5d}x  {row['name']}")
    args.out.write_text(json.dumps({"device": args.device, "settings": vars(args) | {"out": str(args.out)},
                                    "results": results}, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
