"""Pair sets of one kind only (insightface's sample small_lfw.bin: 10 matched pairs): said at once,
naming the file and counts, and `facetrain eval` reports what such a set can tell."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from facetrain.cli import main
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.pairs import load_pairs
from facetrain.eval.set_names import report_file_name
from facetrain.eval.verify_pairs import verify
from facetrain.export.exporter import export_loaded
from facetrain.interop.card import build_card
from facetrain.interop.loading import LoadedModel
from facetrain.models import build_backbone
from facetrain.train.run_config import Config
from tests.support.eval_sets import colour_face

SIZE = (32, 32)


def small_lfw_bin(path: Path, matched: bool = True, pairs: int = 10) -> Path:
    """insightface's build_eval_pack recipe: a pickle of (encoded images, issame), every pair one kind."""
    images = [
        cv2.imencode(".png", cv2.cvtColor(colour_face(index % 6, seed=index, size=SIZE), cv2.COLOR_RGB2BGR))[1]
        .tobytes()
        for index in range(2 * pairs)
    ]  # fmt: skip
    path.write_bytes(pickle.dumps((images, [matched] * pairs), protocol=pickle.HIGHEST_PROTOCOL))
    return path


class NeverCalled(nn.Module):
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        raise AssertionError("embedded a one-kind set")


def test_verify_refuses_a_one_kind_set_before_embedding(tmp_path: Path):
    pairs = load_pairs(small_lfw_bin(tmp_path / "small_lfw.bin"))
    with pytest.raises(FacetrainError) as caught:
        verify(pairs, NeverCalled(), EmbedSettings(SIZE))
    assert str(caught.value).startswith(
        f"{tmp_path / 'small_lfw.bin'} holds 10 pairs: 10 matched, 0 mismatched; verification accuracy, its "
        "threshold, ROC and TAR at FAR need mismatched pairs too; use a pack with both"
    )


def exported(out: Path, threshold: float | None) -> Path:
    torch.manual_seed(0)
    config = Config()
    config.model.backbone = "small"
    config.model.embedding_size = 16
    config.data.image_size = list(SIZE)
    module = build_backbone(config.model, image_size=SIZE).eval()
    evaluation = {} if threshold is None else {"verification": {"accuracy": 0.9, "threshold": threshold}}
    card = build_card(module, config, {"step": 1, "evaluation": evaluation}, SIZE, Path("fresh"))
    export_loaded(
        LoadedModel(module, SIZE, card, Path("fresh"), "checkpoint"), out, ["safetensors"], progress=False
    )
    return out


def run(*args: object):
    return CliRunner().invoke(main, ["eval", *(str(arg) for arg in args)])


def test_eval_reports_similarity_and_the_tar_at_the_models_threshold(tmp_path: Path):
    pairs = small_lfw_bin(tmp_path / "small_lfw.bin")
    result = run(
        exported(tmp_path / "model", threshold=0.5), "--pairs", pairs, "--out", tmp_path / "r", "--quiet"
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r" / f"{report_file_name(pairs)}.json").read_text())
    assert report["num_matched"] == 10 and report["num_mismatched"] == 0 and report["one_kind"] == "matched"
    assert report["threshold"] == 0.5 and 0 <= report["tar"] <= 1
    similarity = report["similarity"]
    assert (
        -1
        <= similarity["min"]
        <= similarity["p5"]
        <= similarity["p50"]
        <= similarity["p95"]
        <= similarity["max"]
        <= 1
    )
    assert result.output.startswith(
        f"note: {pairs} holds 10 pairs: 10 matched, 0 mismatched; verification accuracy, its threshold, ROC "
        "and TAR at FAR need mismatched pairs too; reporting the similarity statistics instead\n"
    )
    accepted = round(report["tar"] * 10)
    assert f"TAR @ 0.5000  {100 * report['tar']:.2f}% ({accepted} of 10 accepted" in result.output
    assert f"mean {similarity['mean']:.4f} ± {similarity['std']:.4f}" in result.output
    norms = report["norms"]  # of the set's images before normalisation, as a two-kind set reports them
    assert (
        norms["images"] > 0
        and 0 < norms["min"] <= norms["p5"] <= norms["median"] <= norms["p95"] <= norms["max"]
    )
    assert f"median {norms['median']:.2f}" in result.output


def test_without_a_threshold_it_says_why_and_mismatched_sets_get_far(tmp_path: Path):
    pairs = small_lfw_bin(tmp_path / "strangers.bin", matched=False, pairs=4)
    model = exported(tmp_path / "model", threshold=None)
    result = run(model, "--pairs", pairs, "--out", tmp_path / "r", "--quiet")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r" / f"{report_file_name(pairs)}.json").read_text())
    assert report["one_kind"] == "mismatched" and report["far"] is None and report["threshold"] is None
    [line] = [line for line in result.output.splitlines() if line.startswith("FAR ")]
    assert line.split(maxsplit=1)[1].startswith(f"not shown: {model} records no threshold")
    assert np.isfinite(report["similarity"]["mean"])
