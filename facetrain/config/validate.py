"""`validate(cfg)`: every value of a config checked before any process, model or data is touched.

Two kinds of rule: the checks each field of `facetrain/config/schema.py` declares (ranges, choices,
registered names), and the rules below that relate several keys, the world size, the device or the
filesystem. The first broken rule is one `FacetrainError` line that names the key, the file, the bad
value and what is allowed, so a user fixes it without reading a traceback.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from facetrain.config.checks import field_checks
from facetrain.config.loader import where_given
from facetrain.config.path_rules import missing_path
from facetrain.config.schema import Config
from facetrain.errors import FacetrainError

# A broken rule: (key, value, what the value must be).
Problem = tuple[str, Any, str]


def validate(
    cfg: Config,
    world_size: int | None = None,
    source: str = "",
    device_type: str | None = None,
    given: Mapping[str, str] | None = None,
) -> None:
    """Raise one FacetrainError for the first value the config does not allow.

    `source` names the config file in the message, `given` the option that set a key instead
    (`override_origins`: "--set"), so a user looks where the bad value was typed; `world_size` and
    `device_type` ("cpu", "cuda") enable the rules that need them (None: those rules are skipped):
    pipeline stages must divide the world size, fp16 and nccl need CUDA.
    """
    problems = itertools.chain(field_problems(cfg), _rule_problems(cfg, world_size, device_type))
    for key, value, allowed in problems:  # the first one only
        raise FacetrainError(f"{where_given(key, source, given)}: {key} = {show(value)}: {allowed}")


def validate_section(section: Any, prefix: str) -> None:
    """The field checks of one section, for library code that receives a section without a whole config."""
    for key, value, allowed in field_problems(section, prefix):  # the first one only
        raise FacetrainError(f"{key} = {show(value)}: {allowed}")


def field_problems(section: Any, prefix: str = "") -> Iterator[Problem]:
    """Every value that breaks a check its field declares, in schema order, sections recursively."""
    for field in dataclasses.fields(section):
        value = getattr(section, field.name)
        key = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            yield from field_problems(value, key + ".")
            continue
        if value is None:
            continue  # only optional fields may be None; the loader enforces the types
        for check in field_checks(field):
            allowed = check.problem(value)
            if allowed is not None:
                yield key, value, allowed
                break


def show(value: Any, limit: int = 200) -> str:
    """A value as a message shows it, cut at `limit` characters (a 3000-digit train.steps was echoed whole)."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def fused_optimizer_conflict(cfg: Config) -> Problem | None:
    """A setting the fused head optimizer cannot honour: it updates the head during the one backward of
    a step, so it cannot accumulate micro-steps nor be skipped by fp16's scaler after an overflow.

    One rule, one behaviour: such a setting turns the fused optimizer off (the head plan,
    `facetrain.train.head_plan`, logs which) and the tiled head keeps a gradient buffer for the
    trainer's optimizer. A run whose world shrinks under train.global_batch gains gradient accumulation
    and so goes on. Only bf16 storage, which needs the fused optimizer, is refused with it."""
    fix = "; or store the head in fp32 (head.weight_dtype, head.state_dtype)"
    optim, parallel = cfg.optim, cfg.parallel
    conflicts = [
        ("optim.grad_accumulation", optim.grad_accumulation, optim.grad_accumulation > 1, "must be 1"),
        ("train.precision", cfg.train.precision, cfg.train.precision == "fp16", "cannot be used"),
        ("parallel.microbatches", parallel.microbatches, parallel.pipeline_stages > 1 and parallel.microbatches > 1,
         "must be 1"),
    ]  # fmt: skip
    return next(
        ((key, value, f"{why} with bf16 head storage (its fused optimizer){fix}") for key, value, broken, why
         in conflicts if broken),
        None,
    )  # fmt: skip


def check_pairs_settings(identities: int, images_per_identity: int, folds: int, per_fold: int) -> None:
    """Fail before rendering anything when the held-out set cannot fill the requested pairs file."""
    if folds < 1 or per_fold < 1:
        raise FacetrainError(
            f"data.synth.pairs_folds and pairs_per_fold must be >= 1, got {folds} and {per_fold}"
        )
    if identities < 2 * folds or images_per_identity < 2:
        raise FacetrainError(
            f"a pairs file with {folds} folds needs >= {2 * folds} held-out identities with >= 2 images "
            f"each, got {identities} with {images_per_identity}; lower data.synth.pairs_folds or add "
            "held-out identities"
        )


def _rule_problems(cfg: Config, world_size: int | None, device_type: str | None) -> Iterator[Problem]:
    """The rules relating several keys, in the order they are reported. Only the first problem is used,
    so each check may assume that those above it hold."""
    from facetrain.heads.margins import build_margin

    optim, data, train, parallel, head = cfg.optim, cfg.data, cfg.train, cfg.parallel, cfg.head
    evaluation, stages, triplet = cfg.eval, parallel.pipeline_stages, cfg.loss.name == "margin_triplet"
    if optim.min_lr > optim.lr:
        yield "optim.min_lr", optim.min_lr, f"must be <= optim.lr ({show(optim.lr)})"
    if data.sampler == "identity" and train.batch_size % data.images_per_identity:
        yield (
            "train.batch_size",
            train.batch_size,
            f"must be a multiple of data.images_per_identity ({data.images_per_identity}) for the "
            "identity sampler",
        )
    if triplet and data.sampler != "identity":
        yield (
            "loss.name",
            cfg.loss.name,
            f"needs data.sampler 'identity', not {data.sampler!r} (the triplet loss needs K images "
            "of each identity in a batch)",
        )
    if triplet and stages > 1:
        yield (
            "loss.name",
            cfg.loss.name,
            "must be 'margin' when parallel.pipeline_stages > 1 (stages pass one tensor, not the features)",
        )
    not_finite = [name for name, value in head.margin_params.items() if not math.isfinite(value)]
    if not_finite:  # an infinite margin passed here and failed at step 1 with advice about the lr
        yield "head.margin_params", head.margin_params, f"{not_finite[0]} must be a finite number"
    else:
        try:
            build_margin(head.margin, **head.margin_params)
        except FacetrainError as error:
            yield "head.margin_params", head.margin_params, str(error)

    # train.global_batch is made of whole micro-batches (train.batch_size) on every data-parallel rank
    if train.global_batch is not None and stages > 1:
        yield (
            "train.global_batch",
            train.global_batch,
            "must be unset when parallel.pipeline_stages > 1 (a pipeline cannot accumulate micro-batches)",
        )
    per_round = train.batch_size * (world_size or 1)
    if train.global_batch is not None and train.global_batch % per_round:
        ranks = f" x {world_size} ranks" if world_size else ""
        yield (
            "train.global_batch",
            train.global_batch,
            f"must be a multiple of train.batch_size ({train.batch_size}){ranks} = {per_round}",
        )

    # bf16 storage needs the tiled head's fused optimizer (it alone rounds updates stochastically), and
    # so none of the settings that optimizer cannot honour; sub-centers exist in the untiled head only
    # (head.mode auto then always picks it)
    low_precision = [key for key in ("weight_dtype", "state_dtype") if getattr(head, key) == "bf16"]
    if head.sub_centers > 1 and (head.mode == "tiled" or low_precision):
        yield (
            "head.sub_centers",
            head.sub_centers,
            "needs the untiled head: head.mode untiled or auto, weight_dtype and state_dtype fp32",
        )
    if low_precision and (head.mode == "untiled" or not head.fused_optimizer):
        yield (
            f"head.{low_precision[0]}",
            "bf16",
            "needs the tiled head's fused optimizer: head.mode tiled or auto, head.fused_optimizer true",
        )
    if low_precision and (conflict := fused_optimizer_conflict(cfg)) is not None:
        yield conflict

    synth = data.synth
    if synth.heldout_identities:
        try:
            check_pairs_settings(
                synth.heldout_identities,
                synth.heldout_images_per_identity,
                synth.pairs_folds,
                synth.pairs_per_fold,
            )
        except FacetrainError as error:
            yield "data.synth.heldout_identities", synth.heldout_identities, str(error)

    # a pipelined backbone supports fp32 only, replaces gradient accumulation by micro-batches, and does
    # not verify during training (the whole backbone lives on no single rank)
    if stages == 1 and parallel.split_points:
        yield "parallel.split_points", parallel.split_points, "needs parallel.pipeline_stages > 1"
    if stages > 1:
        yield from _pipeline_problems(cfg)
    from facetrain.eval.set_names import duplicate_name, set_names

    files = evaluation.pairs_files()
    if (clash := duplicate_name(files)) is not None:
        # sets log and report under their file's stem, and eval.best_by picks one by that name
        name, paths = clash
        yield (
            "eval.pairs",
            evaluation.pairs,
            f"{' and '.join(paths)} would both be the set {name!r}; rename one (sets are named by the "
            "file's stem)",
        )
    if evaluation.best_by is not None and evaluation.best_by not in set_names(files):
        if files:
            allowed = f"must be one of the eval.pairs sets: {', '.join(set_names(files))}"
        else:
            allowed = "needs eval.pairs, the sets it chooses from"
        yield "eval.best_by", evaluation.best_by, allowed
    if optim.head_only_steps and stages > 1:
        yield (
            "optim.head_only_steps",
            optim.head_only_steps,
            "must be 0 when parallel.pipeline_stages > 1 (a pipelined backbone cannot be frozen)",
        )
    if (missing := missing_path(cfg)) is not None:
        yield missing
    if world_size is not None and world_size % stages:
        yield (
            "parallel.pipeline_stages",
            stages,
            f"must divide the world size {world_size} (world = stages x replicas)",
        )

    if device_type not in (None, "cuda") and train.precision == "fp16":
        yield "train.precision", "fp16", f"needs CUDA, this run is on {device_type}; use 'bf16'"
    if device_type not in (None, "cuda") and parallel.backend == "nccl":
        yield "parallel.backend", "nccl", f"needs CUDA, this run is on {device_type}; use 'gloo' or 'auto'"
    # torch.compile's CPU kernels are C++ built at the first step: without a compiler the run would fail
    # there, after the data is loaded, with a long traceback
    compilers = (os.environ.get("CXX", ""), "g++", "c++", "clang++")
    if cfg.model.compile and device_type == "cpu" and not any(shutil.which(c) for c in compilers if c):
        yield (
            "model.compile",
            True,
            "on a CPU needs a C++ compiler (g++ or clang++ on PATH, or CXX); install one or set false",
        )

    # read-only: a run directory that is, or lies under, an existing file cannot be created
    output_dir = Path(train.output_dir)
    for path in (output_dir, *output_dir.parents):
        if path.exists() and not path.is_dir():
            blocker = "is a file" if path == output_dir else f"lies under {path}, which is a file"
            yield "train.output_dir", str(output_dir), f"{blocker}; choose a folder"
    # a run directory in the training data would become part of it: its `checkpoints/` an identity
    # folder without images, its files entries of the dataset
    data_path = Path(data.path)
    inside, container = Path(os.path.realpath(output_dir)), Path(os.path.realpath(data_path))
    if inside.is_relative_to(container):
        where = "is data.path" if inside == container else "lies in data.path"
        yield (
            "train.output_dir",
            str(output_dir),
            f"{where} ({data_path}), and the run's files would become part of the dataset; choose a "
            "folder outside the data",
        )

    # the BN neck and the features before it exist only in a pooled re-id output (small_pooled,
    # reid_r50): the ablation without the neck and the triplet loss need such a backbone
    from facetrain.models import POOLED_OUTPUT_BACKBONES

    pooled = ", ".join(sorted(POOLED_OUTPUT_BACKBONES))
    if cfg.model.backbone not in POOLED_OUTPUT_BACKBONES and not cfg.model.bn_neck:
        yield "model.bn_neck", False, f"needs a backbone with a pooled re-id output ({pooled}); remove it"
    if cfg.model.backbone not in POOLED_OUTPUT_BACKBONES and triplet:
        yield (
            "loss.name",
            "margin_triplet",
            f"needs a backbone with a pooled re-id output ({pooled}), whose features before the BN neck "
            "the triplet loss uses; set model.backbone",
        )


def _pipeline_problems(cfg: Config) -> Iterator[Problem]:
    parallel, train, stages = cfg.parallel, cfg.train, cfg.parallel.pipeline_stages
    if train.precision != "fp32":
        yield "train.precision", train.precision, "must be 'fp32' when parallel.pipeline_stages > 1"
    if cfg.optim.grad_accumulation != 1:
        yield (
            "optim.grad_accumulation",
            cfg.optim.grad_accumulation,
            "must be 1 when parallel.pipeline_stages > 1 (set parallel.microbatches instead)",
        )
    if cfg.eval.pairs:
        yield (
            "eval.pairs",
            cfg.eval.pairs,
            "must be unset when parallel.pipeline_stages > 1; evaluate the checkpoint afterwards with "
            "facetrain eval",
        )
    if train.batch_size % parallel.microbatches:
        yield (
            "parallel.microbatches",
            parallel.microbatches,
            f"must divide train.batch_size ({train.batch_size})",
        )
    if parallel.schedule == "1f1b" and parallel.microbatches < stages:
        yield (
            "parallel.microbatches",
            parallel.microbatches,
            f"must be >= parallel.pipeline_stages ({stages}) with parallel.schedule '1f1b'",
        )
    if parallel.split_points and len(parallel.split_points) != stages - 1:
        yield (
            "parallel.split_points",
            parallel.split_points,
            f"must name parallel.pipeline_stages - 1 = {stages - 1} modules, or none to balance by cost",
        )
