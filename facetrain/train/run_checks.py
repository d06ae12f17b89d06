"""`validate(cfg)`: every value of a run's config checked before any process, model or data is touched.

Three kinds of rule: the checks each field declares (ranges, choices, registered names), the rules of
one section (`facetrain.heads.config.storage_problems`, ...), which its own component owns, and the
rules below that relate several sections, the world size, the device or the filesystem, which belong
to the run that combines them. The first broken rule is one `FacetrainError` line that names the key,
the file, the bad value and what is allowed, so a user fixes it without reading a traceback.
"""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

from facetrain.config.validate import Problem, field_problems, raise_first
from facetrain.data.config import synth_problems
from facetrain.eval.config import set_problems
from facetrain.heads.config import margin_problems, smoothing_problems, storage_problems
from facetrain.models import POOLED_OUTPUT_BACKBONES
from facetrain.models.config import pooled_output_changes
from facetrain.parallel.config import schedule_problems
from facetrain.train.config_paths import missing_path
from facetrain.train.optim import lr_problems
from facetrain.train.run_config import Config


def validate(
    cfg: Config,
    world_size: int | None = None,
    source: str = "",
    device_type: str | None = None,
    given: Mapping[str, str] | None = None,
    reported: Problem | None = None,
) -> None:
    """Raise one FacetrainError for the first value the config does not allow.

    `source` names the config file in the message, `given` the option that set a key instead
    (`override_origins`: "--set"), so a user looks where the bad value was typed; `world_size` and
    `device_type` ("cpu", "cuda") enable the rules that need them (None: those rules are skipped):
    pipeline stages must divide the world size, fp16 and nccl need CUDA. `reported` is a problem the
    caller says itself and is not raised (`facetrain config`'s note on a recipe's placeholder path).
    """
    problems = itertools.chain(field_problems(cfg), rule_problems(cfg, world_size, device_type))
    raise_first((problem for problem in problems if problem != reported), source, given)


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


def rule_problems(cfg: Config, world_size: int | None, device_type: str | None) -> Iterator[Problem]:
    """The rules relating several keys, one concern at a time, in the order they are reported. Only the
    first problem is used, so each check may assume that those above it hold."""
    yield from lr_problems(cfg.optim)
    yield from _loss_problems(cfg)
    yield from margin_problems(cfg.head)
    yield from smoothing_problems(cfg.head)
    yield from _head_init_problems(cfg)
    yield from _global_batch_problems(cfg, world_size)
    # bf16 storage and sub-centers, then the settings bf16's fused optimizer cannot honour
    yield from storage_problems(cfg.head)
    if cfg.head.low_precision_keys() and (conflict := fused_optimizer_conflict(cfg)) is not None:
        yield conflict
    yield from synth_problems(cfg.data.synth)
    yield from _pipelined_backbone_problems(cfg)
    yield from set_problems(cfg.eval)
    yield from _frozen_backbone_problems(cfg)
    yield from _input_path_problems(cfg)
    yield from _machine_problems(cfg, world_size, device_type)
    yield from _output_dir_problems(cfg)
    yield from _pooled_output_problems(cfg)


def _loss_problems(cfg: Config) -> Iterator[Problem]:
    """The identity sampler's batches, the triplet loss's sampler and stages, the teacher's cache and stages."""
    data, train, stages = cfg.data, cfg.train, cfg.parallel.pipeline_stages
    triplet = cfg.loss.name == "margin_triplet"
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
    if cfg.loss.teacher_cache and cfg.loss.teacher is None:
        yield "loss.teacher_cache", True, "needs loss.teacher (there is no teacher to cache)"
    if cfg.loss.teacher_cache and (random := data.augment.random_keys()):
        yield (
            "loss.teacher_cache",
            True,
            "needs the teacher's input to be the same each time a sample is drawn; turn off "
            f"{', '.join(random)} or set loss.teacher_cache: false",
        )
    if cfg.loss.teacher is not None and stages > 1:
        yield (
            "loss.teacher",
            cfg.loss.teacher,
            "must be unset when parallel.pipeline_stages > 1 (no stage holds both the images and the embeddings)",
        )


def _head_init_problems(cfg: Config) -> Iterator[Problem]:
    head = cfg.head
    if head.init == "class_means" and cfg.model.init is None:
        yield (
            "head.init",
            head.init,
            "needs model.init (a pretrained start): a random network's class means teach the head nothing",
        )
    if head.init == "class_means" and cfg.parallel.pipeline_stages > 1:
        yield "head.init", head.init, "must be 'random' when parallel.pipeline_stages > 1"


def _global_batch_problems(cfg: Config, world_size: int | None) -> Iterator[Problem]:
    """train.global_batch is made of whole micro-batches (train.batch_size) on every data-parallel rank."""
    train = cfg.train
    if train.global_batch is not None and cfg.parallel.pipeline_stages > 1:
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


def _pipelined_backbone_problems(cfg: Config) -> Iterator[Problem]:
    """A pipelined backbone supports fp32 only, replaces gradient accumulation by micro-batches, and does
    not verify during training (the whole backbone lives on no single rank)."""
    parallel = cfg.parallel
    if parallel.pipeline_stages == 1 and parallel.split_points:
        yield "parallel.split_points", parallel.split_points, "needs parallel.pipeline_stages > 1"
    if parallel.pipeline_stages > 1:
        yield from _pipeline_problems(cfg)


def _frozen_backbone_problems(cfg: Config) -> Iterator[Problem]:
    optim = cfg.optim
    if optim.head_only_steps and cfg.parallel.pipeline_stages > 1:
        yield (
            "optim.head_only_steps",
            optim.head_only_steps,
            "must be 0 when parallel.pipeline_stages > 1 (a pipelined backbone cannot be frozen)",
        )
    if optim.freeze_stages and cfg.parallel.pipeline_stages > 1:
        yield (
            "optim.freeze_stages",
            optim.freeze_stages,
            "must be 0 when parallel.pipeline_stages > 1 (a pipelined backbone cannot be frozen)",
        )


def _input_path_problems(cfg: Config) -> Iterator[Problem]:
    """The files and folders the run reads: the data, the pairs, the starting model, the teacher."""
    if (missing := missing_path(cfg.data, cfg.eval, cfg.model)) is not None:
        yield missing
    if cfg.loss.teacher is not None and not Path(cfg.loss.teacher).exists():
        yield (
            "loss.teacher",
            cfg.loss.teacher,
            "does not exist; pass a run, a checkpoint or an export directory",
        )


def _machine_problems(cfg: Config, world_size: int | None, device_type: str | None) -> Iterator[Problem]:
    """What the ranks and the device allow: the stages of the world, fp16 and nccl, a compiler."""
    stages = cfg.parallel.pipeline_stages
    if world_size is not None and world_size % stages:
        yield (
            "parallel.pipeline_stages",
            stages,
            f"must divide the world size {world_size} (world = stages x replicas)",
        )
    if device_type not in (None, "cuda") and cfg.train.precision == "fp16":
        yield "train.precision", "fp16", f"needs CUDA, this run is on {device_type}; use 'bf16'"
    if device_type not in (None, "cuda") and cfg.parallel.backend == "nccl":
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


def _output_dir_problems(cfg: Config) -> Iterator[Problem]:
    # read-only: a run directory that is, or lies under, an existing file cannot be created
    output_dir = Path(cfg.train.output_dir)
    for path in (output_dir, *output_dir.parents):
        if path.exists() and not path.is_dir():
            blocker = "is a file" if path == output_dir else f"lies under {path}, which is a file"
            yield "train.output_dir", str(output_dir), f"{blocker}; choose a folder"
    # a run directory in the training data would become part of it: its `checkpoints/` an identity
    # folder without images, its files entries of the dataset
    data_path = Path(cfg.data.path)
    inside, container = Path(os.path.realpath(output_dir)), Path(os.path.realpath(data_path))
    if inside.is_relative_to(container):
        where = "is data.path" if inside == container else "lies in data.path"
        yield (
            "train.output_dir",
            str(output_dir),
            f"{where} ({data_path}), and the run's files would become part of the dataset; choose a "
            "folder outside the data",
        )


def _pooled_output_problems(cfg: Config) -> Iterator[Problem]:
    """The BN neck, the pooling, IBN and the features before the neck exist only in a pooled re-id
    output (small_pooled, reid_r50): their settings and the triplet loss need such a backbone."""
    pooled = ", ".join(sorted(POOLED_OUTPUT_BACKBONES))
    if cfg.model.backbone not in POOLED_OUTPUT_BACKBONES:
        for key, value in pooled_output_changes(cfg.model):
            yield f"model.{key}", value, f"needs a backbone with a pooled re-id output ({pooled}); remove it"
    if cfg.model.backbone not in POOLED_OUTPUT_BACKBONES and cfg.loss.name == "margin_triplet":
        yield (
            "loss.name",
            "margin_triplet",
            f"needs a backbone with a pooled re-id output ({pooled}), whose features before the BN neck "
            "the triplet loss uses; set model.backbone",
        )


def _pipeline_problems(cfg: Config) -> Iterator[Problem]:
    parallel, train = cfg.parallel, cfg.train
    if train.precision not in ("fp32", "auto"):  # auto resolves to fp32 with a pipeline
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
    yield from schedule_problems(parallel)
