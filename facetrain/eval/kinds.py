"""The kinds of evaluation `facetrain eval` runs, one record each: the option that chooses it, the
options only it reads, the report files it writes and how it runs.

The command checks its options against these records and dispatches through `EVAL_KINDS`, so a new
kind is one registration here and its option on the command. A kind's `run` reads its inputs before
it calls `load` (a bad pairs file or IJB protocol fails before the model loads), and returns the
table to print with the report files it wrote.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch import nn

from facetrain.choices import DEFAULT_FOLD_SEED, DEFAULT_FOLDS
from facetrain.data.transforms import RESIZE_AREA
from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.ijb import FaceCrop, evaluate_ijb
from facetrain.eval.ijb_meta import read_ijb_meta
from facetrain.eval.ijb_report import ijb_report_paths, ijb_table, write_ijb_report
from facetrain.eval.one_kind import one_kind_problem, one_kind_table, score_one_kind, write_one_kind_report
from facetrain.eval.pair_making import folder_pair_set, write_pairs_csv
from facetrain.eval.pair_set import PairSet
from facetrain.eval.report import (
    retrieval_report_paths,
    retrieval_table,
    verification_report_paths,
    verification_table,
    write_retrieval_report,
    write_verification_report,
)
from facetrain.eval.rerank import RerankSettings
from facetrain.eval.retrieval import REPORT_NAME, evaluate_market1501, evaluate_reid, reid_report_name
from facetrain.eval.set_names import KEPT_PAIRS_SUFFIX, report_file_name
from facetrain.eval.verify_pairs import load_pairs, verify
from facetrain.logger import logger
from facetrain.registry import Registry


class EvaluatedModel(Protocol):
    """What an evaluation reads of the model `facetrain eval` loaded (`facetrain.interop.LoadedModel`)."""

    module: nn.Module
    image_size: tuple[int, int]

    @property
    def threshold(self) -> float | None: ...

    @property
    def interpolation(self) -> str: ...

    @property
    def step(self) -> int | None: ...


@dataclass(frozen=True)
class EvalRequest:
    """One `facetrain eval`: the input its kind's option named, the options only some kinds read, how to
    embed (`EmbedSettings` but the model's own input size) and where the report goes."""

    target: Any  # the chosen option's value: a path, or (query, gallery) for --reid
    out_dir: Path
    model: Path
    embedding: dict[str, Any]  # batch_size, flip, device, num_workers
    extra: dict[str, Any] = field(default_factory=dict)  # joins each JSON report
    images_root: Path | None = None
    skip_missing: bool = False
    seed: int | None = None
    num_folds: int | None = None
    ijb_target: str = "IJBC"
    rerank: bool = False
    # IJB's aligner for an image size (`facetrain.align.five_points.FivePointCrop`; eval/ cannot import align/)
    face_crop: Callable[[tuple[int, int]], FaceCrop] | None = None

    def settings(self, model: EvaluatedModel, interpolation: str = RESIZE_AREA) -> EmbedSettings:
        return EmbedSettings(model.image_size, interpolation=interpolation, **self.embedding)

    def rerank_settings(self) -> RerankSettings | None:
        return RerankSettings() if self.rerank else None


Outcome = tuple[str, list[Path]]  # the table to print, the report files written


@dataclass(frozen=True)
class EvalKind:
    """One kind of evaluation; calling it runs it (`EVAL_KINDS.build(name, request, load)`)."""

    option: str  # the option of `facetrain eval` that chooses it
    what: str  # for the usage line: "verification"
    options: tuple[str, ...]  # the options only kinds like this one read
    report_paths: Callable[[EvalRequest], list[Path]]
    run: Callable[[EvalRequest, Callable[[], EvaluatedModel]], Outcome]

    def __call__(self, request: EvalRequest, load: Callable[[], EvaluatedModel]) -> Outcome:
        return self.run(request, load)


EVAL_KINDS: Registry[Outcome] = Registry("evaluation")


def eval_kind(name: str) -> EvalKind:
    kind = EVAL_KINDS.get(name)
    assert isinstance(kind, EvalKind), f"evaluation {name!r} is registered without its record"
    return kind


def _score_pairs(
    request: EvalRequest, load: Callable[[], EvaluatedModel], pairs: PairSet, name: str
) -> Outcome:
    if pairs.skipped_pairs:
        logger.warning(
            f"skipped {pairs.skipped_pairs} pairs: {len(pairs.missing)} images missing, e.g. {pairs.missing[0]}"
        )
    if one_kind_problem(pairs) is not None:
        return _score_one_kind(request, load, pairs, name)
    model = load()
    result = verify(pairs, model.module, request.settings(model, model.interpolation))
    extra = {**request.extra, "step": model.step}
    return verification_table(result), write_verification_report(result, request.out_dir, extra, name)


def _score_one_kind(
    request: EvalRequest, load: Callable[[], EvaluatedModel], pairs: PairSet, name: str
) -> Outcome:
    """A pairs file of one kind only: say so at once (before the model loads), then report what it can."""
    logger.warning(f"note: {one_kind_problem(pairs)}; reporting the similarity statistics instead")
    model = load()
    threshold = model.threshold
    source = (
        "the model's own, from its verification"
        if threshold is not None
        else (
            f"{request.model} records no threshold (it was never verified on pairs of both kinds); export it "
            "with --evaluation NAME.json of such a verification to give it one"
        )
    )
    settings = request.settings(model, model.interpolation)
    result = score_one_kind(pairs, model.module, settings, threshold, source)
    return one_kind_table(result), write_one_kind_report(result, request.out_dir, request.extra, name)


def _pairs_name(request: EvalRequest) -> str:
    return report_file_name(request.target)


def _run_pairs(request: EvalRequest, load: Callable[[], EvaluatedModel]) -> Outcome:
    pairs = load_pairs(request.target, request.images_root, request.skip_missing)
    return _score_pairs(request, load, pairs, _pairs_name(request))


def _folder_name(request: EvalRequest) -> str:
    return report_file_name(os.path.abspath(request.target))  # as `folder_pair_set` names its pairs


def _folder_kept_pairs(request: EvalRequest) -> Path:
    return request.out_dir / f"{_folder_name(request)}{KEPT_PAIRS_SUFFIX}.csv"


def _run_folder(request: EvalRequest, load: Callable[[], EvaluatedModel]) -> Outcome:
    seed = DEFAULT_FOLD_SEED if request.seed is None else request.seed
    pairs = folder_pair_set(
        request.target, seed, DEFAULT_FOLDS if request.num_folds is None else request.num_folds
    )
    table, written = _score_pairs(request, load, pairs, _folder_name(request))
    if one_kind_problem(pairs) is None:
        written.append(write_pairs_csv(pairs, _folder_kept_pairs(request), overwrite=True))
    return table, written


def _run_market(request: EvalRequest, load: Callable[[], EvaluatedModel]) -> Outcome:
    model = load()
    result = evaluate_market1501(
        model.module, request.target, request.settings(model), request.rerank_settings()
    )
    return retrieval_table(result), write_retrieval_report(result, request.out_dir, request.extra)


def _run_reid(request: EvalRequest, load: Callable[[], EvaluatedModel]) -> Outcome:
    model = load()
    query, gallery = request.target
    result = evaluate_reid(model.module, query, gallery, request.settings(model), request.rerank_settings())
    return retrieval_table(result), write_retrieval_report(result, request.out_dir, request.extra)


def _run_ijb(request: EvalRequest, load: Callable[[], EvaluatedModel]) -> Outcome:
    assert request.face_crop is not None, "an IJB evaluation needs its face aligner"
    read_ijb_meta(request.target, request.ijb_target)  # a broken protocol file fails before the model loads
    model = load()
    crop = request.face_crop(model.image_size)
    result = evaluate_ijb(model.module, request.target, request.ijb_target, request.settings(model), crop)
    return ijb_table(result), write_ijb_report(result, request.out_dir, request.extra)


EVAL_KINDS.register("pairs")(
    EvalKind(
        "--pairs",
        "verification",
        ("--images", "--skip-missing"),
        lambda request: verification_report_paths(request.out_dir, _pairs_name(request)),
        _run_pairs,
    )
)
EVAL_KINDS.register("folder")(
    EvalKind(
        "--folder",
        "verification",
        ("--seed", "--folds"),
        lambda request: [
            *verification_report_paths(request.out_dir, _folder_name(request)),
            _folder_kept_pairs(request),
        ],
        _run_folder,
    )
)
EVAL_KINDS.register("market")(
    EvalKind(
        "--market",
        "re-id retrieval",
        ("--rerank",),
        lambda request: retrieval_report_paths(request.out_dir, REPORT_NAME),
        _run_market,
    )
)
EVAL_KINDS.register("reid")(
    EvalKind(
        "--reid",
        "re-id retrieval",
        ("--rerank",),
        lambda request: retrieval_report_paths(request.out_dir, reid_report_name(request.target[1])),
        _run_reid,
    )
)
EVAL_KINDS.register("ijb")(
    EvalKind(
        "--ijb",
        "IJB-B/C template verification",
        ("--ijb-target",),
        lambda request: ijb_report_paths(request.out_dir, request.ijb_target),
        _run_ijb,
    )
)
