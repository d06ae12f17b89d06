"""Cutting a backbone into pipeline stages from outside the model.

A backbone is a chain of named top-level modules (see `facetrain.models.Backbone`). For a finer
balance, top-level modules that are themselves chains (the residual stages) are opened one level, so
the units of a face ResNet are `stem, layer1.0, layer1.1, ..., layer4.2, output.norm, ...`. A stage is
a contiguous run of units, reassembled so that its parameter names are exactly the full model's
(`layer3.4.conv1.weight` on whichever stage holds it): checkpoints need no renaming.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.models.backbone import ConvStage


@dataclass(frozen=True)
class Unit:
    """The smallest piece the splitter moves: `name` is its dotted path, `parent` its top-level module."""

    name: str
    module: nn.Module
    parent: str


def pipeline_units(backbone: nn.Module) -> list[Unit]:
    """The backbone as an ordered list of units (top-level chains opened one level)."""
    if not isinstance(backbone, nn.Sequential):
        raise FacetrainError(
            f"{type(backbone).__name__} is not a chain of named modules, so it cannot be split into "
            "pipeline stages; build it as an nn.Sequential (see facetrain.models.Backbone)"
        )
    units: list[Unit] = []
    for parent, module in backbone.named_children():
        children = list(module.named_children()) if isinstance(module, nn.Sequential) else []
        if len(children) > 1:
            units.extend(Unit(f"{parent}.{name}", child, parent) for name, child in children)
        else:
            units.append(Unit(parent, module, parent))
    return units


def boundaries_from_split_points(units: list[Unit], split_points: list[str], stages: int) -> list[int]:
    """Unit indices where stages 1..S-1 begin, from module names (`layer3` or `layer3.4`)."""
    if len(split_points) != stages - 1:
        raise FacetrainError(
            f"parallel.split_points names {len(split_points)} modules but {stages} stages need "
            f"{stages - 1}; list where each stage after the first begins, or leave it empty to balance"
        )
    starts = []
    for point in split_points:
        index = next((i for i, unit in enumerate(units) if point in (unit.name, unit.parent)), None)
        if index is None:
            names = ", ".join(unit.name for unit in units)
            raise FacetrainError(
                f"parallel.split_points: no module {point!r} in the backbone; choose from {names}"
            )
        starts.append(index)
    if starts != sorted(set(starts)) or starts[0] == 0:
        raise FacetrainError(
            f"parallel.split_points {split_points} must name distinct modules in model order, after the first"
        )
    return starts


def balanced_boundaries(costs: list[float], stages: int) -> list[int]:
    """Where stages 1..S-1 begin so that the slowest stage is as fast as possible.

    The pipeline runs at the pace of its slowest stage, so this minimises the largest per-stage sum of
    contiguous costs (exact dynamic programme; backbones have at most a few dozen units).
    """
    n = len(costs)
    if stages > n:
        raise FacetrainError(f"cannot split a backbone of {n} pieces into {stages} pipeline stages")
    prefix = [0.0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)
    worst = [[float("inf")] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    worst[0][0] = 0.0
    for s in range(1, stages + 1):
        for end in range(s, n + 1):
            for start in range(s - 1, end):
                candidate = max(worst[s - 1][start], prefix[end] - prefix[start])
                if candidate < worst[s][end]:
                    worst[s][end], cut[s][end] = candidate, start
    starts, end = [], n
    for s in range(stages, 1, -1):
        end = cut[s][end]
        starts.append(end)
    return starts[::-1]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_unit_costs(units: list[Unit], sample: torch.Tensor, repeats: int = 2) -> list[float]:
    """Seconds of forward plus backward for each unit on `sample` (the best of `repeats`).

    Each unit is timed on a copy moved to the sample's device one at a time, so the backbone's own
    weights, BN statistics and device stay untouched and a model too big for one device can still be
    measured. The RNG is forked so that dropout in the timing leaves training's random stream alone.
    """
    device = sample.device
    costs = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        x = sample
        for unit in units:
            module = copy.deepcopy(unit.module).to(device)
            best = float("inf")
            for _ in range(repeats + 1):
                inputs = x.detach().requires_grad_(True)
                _synchronize(device)
                began = time.perf_counter()
                out = module(inputs)
                if out.requires_grad:
                    out.backward(torch.ones_like(out))
                _synchronize(device)
                best = min(best, time.perf_counter() - began)
            costs.append(best)
            x = out.detach()
            del module
    return costs


def _assemble(backbone: nn.Module, units: list[Unit]) -> nn.Sequential:
    """One stage: the units' top-level modules, whole where the stage holds all of one, else a slice."""
    by_parent: OrderedDict[str, list[Unit]] = OrderedDict()
    for unit in units:
        by_parent.setdefault(unit.parent, []).append(unit)
    modules: OrderedDict[str, nn.Module] = OrderedDict()
    for parent, members in by_parent.items():
        whole = getattr(backbone, parent)
        names = [unit.name.partition(".")[2] for unit in members]
        if members[0].name == parent or len(names) == len(whole):
            modules[parent] = whole
        elif isinstance(whole, ConvStage):
            modules[parent] = whole.subset(names)
        else:
            modules[parent] = nn.Sequential(OrderedDict((name, whole.get_submodule(name)) for name in names))
    return nn.Sequential(modules)


def split_backbone(backbone: nn.Module, starts: list[int]) -> list[nn.Sequential]:
    """The stage modules for stages beginning at unit indices `[0, *starts]` (sharing the weights)."""
    units = pipeline_units(backbone)
    edges = [0, *starts, len(units)]
    return [_assemble(backbone, units[a:b]) for a, b in zip(edges, edges[1:])]


@torch.no_grad()
def stage_boundary_shapes(
    backbone: nn.Module, starts: list[int], microbatch_shape: tuple[int, ...]
) -> list[tuple[int, ...]]:
    """The shape entering each stage, then the shape leaving the last: S + 1 shapes for S stages.

    Computed on a copy on the meta device (no memory, no arithmetic, the weights untouched), so the
    pipeline knows its stages' tensors before the first step instead of inferring them from a
    forward that would run through DDP and the head.
    """
    shapes = [tuple(microbatch_shape)]
    activation = torch.empty(microbatch_shape, device="meta")
    for stage in split_backbone(copy.deepcopy(backbone).to("meta"), starts):
        activation = stage(activation)
        shapes.append(tuple(activation.shape))
    return shapes
