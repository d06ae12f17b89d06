"""`validate(cfg)`: every value of a config checked before any process, model or data is touched.

Two kinds of rule: the checks each field of `facetrain/config/schema.py` declares (ranges, choices,
registered names), and the rules below that relate several keys, the world size, the device or the
filesystem. The first broken rule is one `FacetrainError` line that names the key, the file, the bad
value and what is allowed, so a user fixes it without reading a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from facetrain.config.checks import field_checks
from facetrain.config.loader import where_given
from facetrain.config.path_rules import missing_path
from facetrain.config.schema import Config
from facetrain.errors import FacetrainError


@dataclasses.dataclass(frozen=True)
class Context:
    """What the rules see: the world size and device type when known (None: those rules are skipped)."""

    cfg: Config
    world_size: int | None
    device_type: str | None


# A rule returns (key, value, what the value must be) when broken, None when it holds.
Problem = tuple[str, Any, str]
Rule = Callable[[Context], Problem | None]


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
    `device_type` ("cpu", "cuda") enable the rules that need them: pipeline stages must divide the
    world size, fp16 and nccl need CUDA.
    """
    problem = next(field_problems(cfg), None)
    if problem is None:
        context = Context(cfg, world_size, device_type)
        problem = next((found for rule in RULES if (found := rule(context)) is not None), None)
    if problem is not None:
        key, value, allowed = problem
        raise FacetrainError(f"{where_given(key, source, given)}: {key} = {show(value)}: {allowed}")


def validate_section(section: Any, prefix: str) -> None:
    """The field checks of one section, for library code that receives a section without a whole config."""
    problem = next(field_problems(section, prefix), None)
    if problem is not None:
        key, value, allowed = problem
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


def show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _min_lr_at_most_lr(s: Context) -> Problem | None:
    optim = s.cfg.optim
    if optim.min_lr > optim.lr:
        return "optim.min_lr", optim.min_lr, f"must be <= optim.lr ({show(optim.lr)})"
    return None


def _identity_batches_divide(s: Context) -> Problem | None:
    data, batch = s.cfg.data, s.cfg.train.batch_size
    if data.sampler == "identity" and batch % data.images_per_identity:
        return (
            "train.batch_size",
            batch,
            f"must be a multiple of data.images_per_identity ({data.images_per_identity}) for the "
            "identity sampler",
        )
    return None


def _metric_loss_settings(s: Context) -> Problem | None:
    cfg = s.cfg
    if cfg.loss.name != "margin_triplet":
        return None
    if cfg.data.sampler != "identity":
        return (
            "loss.name",
            cfg.loss.name,
            f"needs data.sampler 'identity', not {cfg.data.sampler!r} (the triplet loss needs K images "
            "of each identity in a batch)",
        )
    if cfg.parallel.pipeline_stages > 1:
        return (
            "loss.name",
            cfg.loss.name,
            "must be 'margin' when parallel.pipeline_stages > 1 (stages pass one tensor, not the features)",
        )
    return None


def _margin_takes_params(s: Context) -> Problem | None:
    from facetrain.heads.margins import build_margin

    head = s.cfg.head
    try:
        build_margin(head.margin, **head.margin_params)
    except FacetrainError as error:
        return "head.margin_params", head.margin_params, str(error)
    return None


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


def _global_batch_fits(s: Context) -> Problem | None:
    """train.global_batch is made of whole micro-batches (train.batch_size) on every data-parallel rank."""
    train, stages = s.cfg.train, s.cfg.parallel.pipeline_stages
    if train.global_batch is None:
        return None
    if stages > 1:
        return (
            "train.global_batch",
            train.global_batch,
            "must be unset when parallel.pipeline_stages > 1 (a pipeline cannot accumulate micro-batches)",
        )
    per_round = train.batch_size * (s.world_size or 1)
    if train.global_batch % per_round:
        ranks = f" x {s.world_size} ranks" if s.world_size else ""
        return (
            "train.global_batch",
            train.global_batch,
            f"must be a multiple of train.batch_size ({train.batch_size}){ranks} = {per_round}",
        )
    return None


def _head_mode_settings(s: Context) -> Problem | None:
    """bf16 storage needs the tiled head's fused optimizer (it alone rounds updates stochastically), and
    so none of the settings that optimizer cannot honour (`fused_optimizer_conflict`). Sub-centers
    exist in the untiled head only (head.mode auto then always picks it)."""
    head = s.cfg.head
    low_precision = [key for key in ("weight_dtype", "state_dtype") if getattr(head, key) == "bf16"]
    if head.sub_centers > 1 and (head.mode == "tiled" or low_precision):
        return (
            "head.sub_centers",
            head.sub_centers,
            "needs the untiled head: head.mode untiled or auto, weight_dtype and state_dtype fp32",
        )
    if low_precision and (head.mode == "untiled" or not head.fused_optimizer):
        return (
            f"head.{low_precision[0]}",
            "bf16",
            "needs the tiled head's fused optimizer: head.mode tiled or auto, head.fused_optimizer true",
        )
    return fused_optimizer_conflict(s.cfg) if low_precision else None


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


def _synthetic_pairs_fit(s: Context) -> Problem | None:
    synth = s.cfg.data.synth
    if not synth.heldout_identities:
        return None
    try:
        check_pairs_settings(
            synth.heldout_identities,
            synth.heldout_images_per_identity,
            synth.pairs_folds,
            synth.pairs_per_fold,
        )
    except FacetrainError as error:
        return "data.synth.heldout_identities", synth.heldout_identities, str(error)
    return None


def _output_dir_is_a_folder(s: Context) -> Problem | None:
    """Read-only: a run directory that is, or lies under, an existing file cannot be created."""
    output_dir = Path(s.cfg.train.output_dir)
    for path in (output_dir, *output_dir.parents):
        if path.exists() and not path.is_dir():
            blocker = "is a file" if path == output_dir else f"lies under {path}, which is a file"
            return "train.output_dir", str(output_dir), f"{blocker}; choose a folder"
    return None


def _output_dir_outside_the_data(s: Context) -> Problem | None:
    """A run directory in the training data would become part of it: its `checkpoints/` an identity
    folder without images, its files entries of the dataset."""
    output_dir, data = Path(s.cfg.train.output_dir), Path(s.cfg.data.path)
    inside, container = Path(os.path.realpath(output_dir)), Path(os.path.realpath(data))
    if inside.is_relative_to(container):
        where = "is data.path" if inside == container else "lies in data.path"
        return (
            "train.output_dir",
            str(output_dir),
            f"{where} ({data}), and the run's files would become part of the dataset; choose a folder "
            "outside the data",
        )
    return None


def _pipeline_settings(s: Context) -> Problem | None:
    """A pipelined backbone supports fp32 only, replaces gradient accumulation by micro-batches, and does
    not verify during training (the whole backbone lives on no single rank)."""
    cfg = s.cfg
    parallel = cfg.parallel
    stages = parallel.pipeline_stages
    if stages == 1:
        if parallel.split_points:
            return "parallel.split_points", parallel.split_points, "needs parallel.pipeline_stages > 1"
        return None
    if cfg.train.precision != "fp32":
        return "train.precision", cfg.train.precision, "must be 'fp32' when parallel.pipeline_stages > 1"
    if cfg.optim.grad_accumulation != 1:
        return (
            "optim.grad_accumulation",
            cfg.optim.grad_accumulation,
            "must be 1 when parallel.pipeline_stages > 1 (set parallel.microbatches instead)",
        )
    if cfg.eval.pairs:
        return (
            "eval.pairs",
            cfg.eval.pairs,
            "must be unset when parallel.pipeline_stages > 1; evaluate the checkpoint afterwards with "
            "facetrain eval",
        )
    if cfg.train.batch_size % parallel.microbatches:
        return (
            "parallel.microbatches",
            parallel.microbatches,
            f"must divide train.batch_size ({cfg.train.batch_size})",
        )
    if parallel.schedule == "1f1b" and parallel.microbatches < stages:
        return (
            "parallel.microbatches",
            parallel.microbatches,
            f"must be >= parallel.pipeline_stages ({stages}) with parallel.schedule '1f1b'",
        )
    if parallel.split_points and len(parallel.split_points) != stages - 1:
        return (
            "parallel.split_points",
            parallel.split_points,
            f"must name parallel.pipeline_stages - 1 = {stages - 1} modules, or none to balance by cost",
        )
    return None


def _verification_sets_named(s: Context) -> Problem | None:
    """Each verification set logs and reports under its file's stem, and `eval.best_by` picks one of
    them by that name: two sets of one name would be indistinguishable."""
    from facetrain.eval.set_names import duplicate_name, set_names

    evaluation = s.cfg.eval
    files = evaluation.pairs_files()
    clash = duplicate_name(files)
    if clash is not None:
        name, paths = clash
        return (
            "eval.pairs",
            evaluation.pairs,
            f"{' and '.join(paths)} would both be the set {name!r}; rename one (sets are named by the "
            "file's stem)",
        )
    if evaluation.best_by is not None and evaluation.best_by not in set_names(files):
        if not files:
            return "eval.best_by", evaluation.best_by, "needs eval.pairs, the sets it chooses from"
        return (
            "eval.best_by",
            evaluation.best_by,
            f"must be one of the eval.pairs sets: {', '.join(set_names(files))}",
        )
    return None


def _named_paths_exist(s: Context) -> Problem | None:
    return missing_path(s.cfg)


def _head_only_steps_without_pipeline(s: Context) -> Problem | None:
    if s.cfg.optim.head_only_steps and s.cfg.parallel.pipeline_stages > 1:
        return (
            "optim.head_only_steps",
            s.cfg.optim.head_only_steps,
            "must be 0 when parallel.pipeline_stages > 1 (a pipelined backbone cannot be frozen)",
        )
    return None


def _stages_divide_world(s: Context) -> Problem | None:
    stages = s.cfg.parallel.pipeline_stages
    if s.world_size is not None and s.world_size % stages:
        return (
            "parallel.pipeline_stages",
            stages,
            f"must divide the world size {s.world_size} (world = stages x replicas)",
        )
    return None


def _cuda_only_settings(s: Context) -> Problem | None:
    if s.device_type is None or s.device_type == "cuda":
        return None
    if s.cfg.train.precision == "fp16":
        return "train.precision", "fp16", f"needs CUDA, this run is on {s.device_type}; use 'bf16'"
    if s.cfg.parallel.backend == "nccl":
        return "parallel.backend", "nccl", f"needs CUDA, this run is on {s.device_type}; use 'gloo' or 'auto'"
    return None


def _compiler_for_compile(s: Context) -> Problem | None:
    """torch.compile's CPU kernels are C++ built at the first step: without a compiler the run would
    fail there, after the data is loaded, with a long traceback."""
    if not s.cfg.model.compile or s.device_type != "cpu":
        return None
    if any(shutil.which(name) for name in (os.environ.get("CXX", ""), "g++", "c++", "clang++") if name):
        return None
    return (
        "model.compile",
        True,
        "on a CPU needs a C++ compiler (g++ or clang++ on PATH, or CXX); install one or set false",
    )


def _pooled_output_settings(s: Context) -> Problem | None:
    """The BN neck and the features before it exist only in a pooled re-id output (small_pooled,
    reid_r50): the ablation without the neck and the triplet loss need such a backbone."""
    from facetrain.models import POOLED_OUTPUT_BACKBONES

    model, pooled = s.cfg.model, ", ".join(sorted(POOLED_OUTPUT_BACKBONES))
    if model.backbone in POOLED_OUTPUT_BACKBONES:
        return None
    if not model.bn_neck:
        return "model.bn_neck", False, f"needs a backbone with a pooled re-id output ({pooled}); remove it"
    if s.cfg.loss.name == "margin_triplet":
        return (
            "loss.name",
            "margin_triplet",
            f"needs a backbone with a pooled re-id output ({pooled}), whose features before the BN neck "
            "the triplet loss uses; set model.backbone",
        )
    return None


RULES: list[Rule] = [
    _min_lr_at_most_lr,
    _identity_batches_divide,
    _metric_loss_settings,
    _margin_takes_params,
    _global_batch_fits,
    _head_mode_settings,
    _synthetic_pairs_fit,
    _pipeline_settings,
    _verification_sets_named,
    _head_only_steps_without_pipeline,
    _named_paths_exist,
    _stages_divide_world,
    _cuda_only_settings,
    _compiler_for_compile,
    _output_dir_is_a_folder,
    _output_dir_outside_the_data,
    _pooled_output_settings,
]
