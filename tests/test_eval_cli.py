"""`facetrain eval` end to end on an exported small backbone and synthetic held-out pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.eval.embedding import EmbedSettings
from facetrain.eval.pairs import load_pairs
from facetrain.eval.retrieval import evaluate_market1501
from facetrain.eval.set_names import report_file_name
from facetrain.eval.verify_pairs import verify
from facetrain.export.exporter import export_loaded, export_model
from facetrain.interop.card import build_card, with_verification_report
from facetrain.interop.loading import LoadedModel, load_model
from facetrain.models import build_backbone
from facetrain.train.run_config import Config
from tests.support.eval_sets import write_lfw_style_set, write_market

IMAGE_SIZE = (32, 32)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Config()
    config.model.backbone = "small"
    config.model.embedding_size = 16
    config.data.image_size = list(IMAGE_SIZE)
    module = build_backbone(config.model, image_size=IMAGE_SIZE).eval()
    card = build_card(module, config, {"step": 1}, IMAGE_SIZE, Path("fresh"))
    out = tmp_path_factory.mktemp("model")
    export_loaded(
        LoadedModel(module, IMAGE_SIZE, card, Path("fresh"), "checkpoint"),
        out,
        ["safetensors"],
        progress=False,
    )
    return out


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lfw_style_set(tmp_path_factory.mktemp("heldout"))


def run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["eval", *(str(arg) for arg in args)])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def test_help_shows_examples():
    code, output = run("--help")
    assert code == 0 and "Examples:" in output and "facetrain eval runs/" in output


def test_eval_pairs_writes_the_report_beside_the_model(model_dir: Path, pairs_file: Path):
    code, output = run(model_dir, "--pairs", pairs_file, "--batch-size", "5", "--quiet")
    assert code == 0, output
    assert "accuracy" in output and "over 2 folds" in output and "ROC AUC" in output
    report = model_dir / "eval"
    name = report_file_name(pairs_file)
    assert name.startswith(f"{pairs_file.parent.name}-pairs-")
    assert sorted(path.name for path in report.iterdir()) == [
        f"{name}.json",
        f"{name}_folds.csv",
        f"{name}_norms.png",
        f"{name}_roc.png",
    ]
    assert f"wrote {report / name}.json" in output
    figures = json.loads((report / f"{name}.json").read_text())
    loaded = load_model(model_dir)
    expected = verify(load_pairs(pairs_file), loaded.module, EmbedSettings(loaded.image_size, progress=False))
    assert figures["model"] == str(model_dir)
    assert figures["step"] == 1  # the card's training step; the ROC plot's title names it and the model
    assert figures["accuracy"] == pytest.approx(expected.accuracy)
    assert figures["auc"] == pytest.approx(expected.metrics.auc)
    assert figures["xnorm"] == pytest.approx(expected.xnorm, rel=1e-5)
    assert figures["num_pairs"] == 12 and figures["flip"] is True
    # the norms before normalisation: quantiles of the set's images, in the JSON and the table
    norms = expected.norms.images
    assert figures["norms"]["images"] == len(norms) and figures["norms"]["normalized_inside"] is False
    assert figures["norms"]["median"] == pytest.approx(float(np.median(norms)), rel=1e-5)
    assert figures["norms"]["min"] == pytest.approx(float(norms.min()), rel=1e-5)
    assert f"p95 {figures['norms']['p95']:.2f}" in output


def test_skip_missing_and_no_flip(model_dir: Path, pairs_file: Path, tmp_path: Path):
    lines = pairs_file.read_text().splitlines()
    broken = tmp_path / "pairs.txt"
    broken.write_text("\n".join([lines[0], "Nobody\t1\t2", *lines[2:]]) + "\n")
    code, output = run(
        model_dir, "--pairs", broken, "--images", pairs_file.parent, "--quiet", "--out", tmp_path / "r"
    )
    assert code == 2
    assert (
        "error: " in output and "2 images used by 1 pairs are missing" in output and "Traceback" not in output
    )
    code, output = run(
        model_dir,
        "--pairs",
        broken,
        "--images",
        pairs_file.parent,
        "--skip-missing",
        "--no-flip",
        "--quiet",
        "--out",
        tmp_path / "r",
    )
    assert code == 0, output
    assert "skipped 1 pairs: 2 images missing" in output
    figures = json.loads((tmp_path / "r" / f"{report_file_name(broken)}.json").read_text())
    assert figures["skipped_pairs"] == 1 and figures["num_pairs"] == 11 and figures["flip"] is False


def test_malformed_line_is_a_one_line_error(model_dir: Path, tmp_path: Path):
    (tmp_path / "pairs.txt").write_text("Ann 1 2\nAnn 1\n")
    code, output = run(model_dir, "--pairs", tmp_path / "pairs.txt", "--out", tmp_path / "r")
    assert code == 2 and output.strip().splitlines() == [
        f"error: {tmp_path / 'pairs.txt'} line 2: expected 'name i j' or 'name1 i name2 j', got 2 fields"
    ]


def test_an_earlier_report_is_replaced_only_with_overwrite(model_dir: Path, pairs_file: Path, tmp_path: Path):
    out = tmp_path / "r"
    name = report_file_name(pairs_file)
    assert run(model_dir, "--pairs", pairs_file, "--out", out, "--quiet")[0] == 0
    (out / f"{name}.json").write_text('{"accuracy": "an earlier model"}')
    folds = (out / f"{name}_folds.csv").read_bytes()
    code, output = run(model_dir, "--pairs", pairs_file, "--out", out, "--quiet")
    assert code == 2 and "Traceback" not in output
    assert output.strip() == f"error: {out / name}.json already exists; pass --overwrite to replace it"
    assert (out / f"{name}.json").read_text() == '{"accuracy": "an earlier model"}'
    assert (out / f"{name}_folds.csv").read_bytes() == folds
    code, output = run(model_dir, "--pairs", pairs_file, "--out", out, "--quiet", "--overwrite")
    assert code == 0, output
    assert "accuracy" in json.loads((out / f"{name}.json").read_text())


def test_two_files_called_pairs_txt_get_two_reports(model_dir: Path, pairs_file: Path, tmp_path: Path):
    """Same stem, different folders: neither report replaces the other, nor the trainer's step_*.json."""
    out = tmp_path / "r"
    out.mkdir()
    (out / "step_00000010.json").write_text("{}")  # what the trainer keeps in RUN/eval
    copy = tmp_path / "lfw" / "pairs.txt"
    copy.parent.mkdir()
    copy.write_text(pairs_file.read_text())
    assert run(model_dir, "--pairs", pairs_file, "--out", out, "--quiet")[0] == 0
    code, output = run(model_dir, "--pairs", copy, "--images", pairs_file.parent, "--out", out, "--quiet")
    assert code == 0, output
    reports = sorted(path.name for path in out.glob("*.json"))
    assert len(reports) == 3 and "step_00000010.json" in reports
    assert f"{report_file_name(copy)}.json" in reports and report_file_name(copy).startswith("lfw-pairs-")
    assert (out / "step_00000010.json").read_text() == "{}"


@pytest.mark.parametrize(
    "args",
    [[], ["--pairs", "p.txt", "--market", "m"], ["--market", "m", "--skip-missing"]],
)
def test_usage_errors(model_dir: Path, args: list[str]):
    code, output = run(model_dir, *args)
    assert code == 2 and "Usage:" in output


def test_eval_market(model_dir: Path, tmp_path: Path):
    write_market(tmp_path / "market")
    code, output = run(model_dir, "--market", tmp_path / "market", "--out", tmp_path / "r", "--quiet")
    assert code == 0, output
    assert "rank-1" in output and "mAP" in output
    figures = json.loads((tmp_path / "r" / "market1501.json").read_text())
    loaded = load_model(model_dir)
    expected = evaluate_market1501(
        loaded.module, tmp_path / "market", EmbedSettings(loaded.image_size, progress=False)
    )
    assert figures["mAP"] == pytest.approx(expected.metrics.mean_ap)
    assert figures["rank1"] == pytest.approx(expected.metrics.cmc[1])


def test_eval_folder_makes_balanced_pairs_and_keeps_them(model_dir: Path, tmp_path: Path):
    root = tmp_path / "heldout"
    write_lfw_style_set(root)
    code, output = run(
        model_dir, "--folder", root, "--seed", "3", "--folds", "4", "--out", tmp_path / "r", "--quiet"
    )
    assert code == 0, output
    assert "72 (36 matched, 36 mismatched, 0 skipped)" in output and "over 4 folds (the file's)" not in output
    assert "over 4 folds (stratified)" in output and "baseline" in output and "50.00%" in output
    name = report_file_name(root)
    assert name.startswith(f"{tmp_path.name}-heldout-")
    assert sorted(path.name for path in (tmp_path / "r").iterdir()) == [
        f"{name}.json",
        f"{name}.pairs.csv",
        f"{name}_folds.csv",
        f"{name}_norms.png",
        f"{name}_roc.png",
    ]
    figures = json.loads((tmp_path / "r" / f"{name}.json").read_text())
    kept = load_pairs(tmp_path / "r" / f"{name}.pairs.csv")
    assert kept.num_pairs == 72 and kept.num_matched == 36 and len(set(kept.folds.tolist())) == 4
    loaded = load_model(model_dir)
    expected = verify(kept, loaded.module, EmbedSettings(loaded.image_size, progress=False))
    assert figures["accuracy"] == pytest.approx(expected.accuracy)
    assert figures["threshold"] == pytest.approx(expected.metrics.operating_point.threshold)
    assert figures["baseline_accuracy"] == 0.5 and figures["folds_source"] == "stratified"
    code, output = run(
        model_dir,
        "--pairs",
        tmp_path / "r" / f"{name}.pairs.csv",
        "--out",
        tmp_path / "r",
        "--quiet",
        "--overwrite",
    )
    assert code == 0, output  # scoring the kept pairs again replaces the folder's report, no near-twin
    assert len(list((tmp_path / "r").iterdir())) == 5  # the four report files and the kept pairs
    assert json.loads((tmp_path / "r" / f"{name}.json").read_text())["accuracy"] == figures["accuracy"]


@pytest.mark.parametrize(
    "args",
    [
        ["--pairs", "p.txt", "--folder", "f"],
        ["--pairs", "p.txt", "--seed", "1"],
        ["--folder", "f", "--images", "i"],
    ],
)
def test_folder_usage_errors(model_dir: Path, args: list[str]):
    code, output = run(model_dir, *args)
    assert code == 2 and "Usage:" in output


def test_the_card_and_compare_say_at_which_far_the_threshold_sits(model_dir: Path, tmp_path: Path):
    root = tmp_path / "heldout"
    write_lfw_style_set(root)
    assert run(model_dir, "--folder", root, "--out", tmp_path / "r", "--quiet")[0] == 0
    report_path = tmp_path / "r" / f"{report_file_name(root)}.json"
    report = json.loads(report_path.read_text())
    exported = export_model(
        model_dir,
        tmp_path / "export",
        ["safetensors"],
        progress=False,
        verification_report=report_path,
    )
    card = exported.card
    assert card["threshold"] == report["threshold"] and card["threshold_far"] == report["threshold_far"]
    assert card["threshold_tar"] == report["threshold_tar"]
    photos = sorted(root.rglob("*.png"))[:2]
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "export"), *map(str, photos)])
    assert result.exit_code == 0, result.output
    assert f"threshold {report['threshold']:.4f}" in result.output
    assert f"(threshold at FAR {100 * report['threshold_far']:.2f}% in evaluation)" in result.output
    by_hand = CliRunner().invoke(
        main, ["compare", str(tmp_path / "export"), *map(str, photos), "--threshold", "0.5"]
    )
    assert by_hand.exit_code == 0 and "FAR" not in by_hand.output


def test_a_report_without_far_leaves_it_null_in_the_card(tmp_path: Path):
    old_report = tmp_path / "old.json"
    old_report.write_text(json.dumps({"accuracy": 0.9, "threshold": 0.31}))
    card = with_verification_report({"evaluation": {}}, old_report)
    assert card["threshold"] == 0.31 and card["threshold_far"] is None and card["threshold_tar"] is None
