"""`facetrain eval --reid QUERY GALLERY [--rerank]`: person re-id retrieval between two image sets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from facetrain.interop.loading import LoadedModel


def reid_report_paths(out_dir: Path, gallery: str) -> list[Path]:
    """The files `evaluate_reid_sets` writes into `out_dir` for this gallery."""
    from facetrain.eval.report import retrieval_report_paths
    from facetrain.eval.retrieval import reid_report_name

    return retrieval_report_paths(out_dir, reid_report_name(gallery))


def evaluate_reid_sets(
    load: Callable[[], LoadedModel],
    query: str,
    gallery: str,
    rerank: bool,
    out_dir: Path,
    options: dict,
    extra: dict,
) -> list[Path]:
    """Embed both sets with the model `load` gives, print the CMC/mAP table and write the JSON report and CMC plot."""
    from facetrain.eval.report import retrieval_table, write_retrieval_report
    from facetrain.eval.rerank import RerankSettings
    from facetrain.eval.retrieval import evaluate_reid

    loaded = load()
    settings = RerankSettings() if rerank else None
    result = evaluate_reid(loaded.module, query, gallery, loaded.image_size, rerank=settings, **options)
    click.echo(retrieval_table(result))
    return write_retrieval_report(result, out_dir, extra)
