"""`facetrain synth`, `facetrain data` and `facetrain bench data` through click's test runner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result

from facetrain.cli import main
from facetrain.data import stats as stats_module
from facetrain.data.folder import scan_image_folder
from facetrain.data.recordio import write_recordio
from facetrain.data.stats import find_corrupt_images, guess_source
from facetrain.errors import FacetrainError
from tests.support.images import random_rgb, write_image, write_market_tree


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, [str(arg) for arg in args])


def one_line_error(result: Result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def faces(tmp_path: Path) -> Path:
    """Three identities (4, 2 and 3 images), one image corrupt."""
    rng = np.random.default_rng(0)
    root = tmp_path / "faces"
    for identity, count in (("a", 4), ("b", 2), ("c", 3)):
        for number in range(count):
            write_image(root / identity / f"{number}.jpg", random_rgb(rng))
    (root / "b" / "1.jpg").write_bytes(b"\xff\xd8 truncated")
    return root


@pytest.mark.parametrize("command", [["synth"], ["data"], ["bench", "data"]])
def test_help_has_examples(command):
    result = invoke(*command, "--help")
    assert result.exit_code == 0 and "Examples:" in result.output


def test_synth_writes_the_sets_and_says_where(tmp_path):
    out = tmp_path / "synth"
    args = ["synth", "-o", out, "--identities", 3, "--images-per-identity", 2, "--heldout-identities", 4]
    args += [
        "--heldout-images-per-identity",
        2,
        "--pairs-folds",
        2,
        "--pairs-per-fold",
        3,
        "--image-size",
        24,
    ]
    result = invoke(*args, "--seed", 5)
    assert result.exit_code == 0, result.output
    assert str(out / "train") in result.output and str(out / "heldout" / "pairs.txt") in result.output
    assert len(scan_image_folder(out / "train").labels) == 6
    assert len((out / "heldout" / "pairs.txt").read_text().splitlines()) == 1 + 2 * 2 * 3
    assert "--overwrite" in one_line_error(invoke(*args))
    assert invoke(*args, "--overwrite").exit_code == 0


def test_synth_impossible_pairs_is_one_line(tmp_path):
    error = one_line_error(
        invoke("synth", "-o", tmp_path / "s", "--identities", 2, "--heldout-identities", 3)
    )
    assert "pairs_folds" in error


def test_stats_of_a_folder_counts_and_finds_the_corrupt_file(faces):
    result = invoke("data", faces, "--workers", 1)
    assert result.exit_code == 0, result.output
    output = result.output
    assert "source      folder" in output and "identities  3" in output and "images      9" in output
    summary = dict(
        line.split() for line in output.split("images per identity\n")[1].split("\n\n")[0].splitlines()
    )
    assert (
        float(summary["mean"]) == pytest.approx(3.0)
        and float(summary["min"]) == 2
        and float(summary["max"]) == 4
    )
    assert "corrupt images: 1 of 9 decoded" in output and str(faces / "b" / "1.jpg") in output


def test_stats_without_decoding(faces):
    result = invoke("data", faces, "--no-decode")
    assert result.exit_code == 0 and "not checked (--no-decode)" in result.output


def test_stats_guesses_list_recordio_and_market_sources(faces, tmp_path):
    market_root = write_market_tree(tmp_path / "market")
    (faces / "b" / "1.jpg").unlink()
    list_path = faces / "train.tsv"
    list_path.write_text("a/0.jpg\t5\nc/1.jpg\t6\nc/2.jpg\t6\n")
    rec_path, _ = write_recordio(faces, tmp_path / "rec" / "train", progress=False)
    expected = {list_path: ("list", 2, 3), rec_path: ("recordio", 3, 8), market_root: ("market1501", 2, 3)}
    for path, (source, identities, images) in expected.items():
        assert guess_source(path) == source
        result = invoke("data", path)
        assert result.exit_code == 0, result.output
        assert f"source      {source}" in result.output
        assert f"identities  {identities}\n" in result.output and f"images      {images}\n" in result.output
    assert "cameras     3" in invoke("data", market_root).output
    assert guess_source(tmp_path / "rec") == "recordio" and guess_source(faces) == "folder"


def test_stats_errors_are_one_line(tmp_path):
    assert str(tmp_path / "none") in one_line_error(invoke("data", tmp_path / "none"))
    (tmp_path / "notes.md").write_text("hello")
    assert "--source" in one_line_error(invoke("data", tmp_path / "notes.md"))
    (tmp_path / "empty").mkdir()
    assert "no identity folders" in one_line_error(invoke("data", tmp_path / "empty"))


def test_corrupt_scan_in_worker_processes_matches_the_serial_one(faces, monkeypatch):
    monkeypatch.setattr(stats_module, "_CHUNK", 2)
    reader = scan_image_folder(faces).reader
    serial = find_corrupt_images(reader, workers=1, progress=False)
    assert serial == [str(faces / "b" / "1.jpg")]
    assert find_corrupt_images(reader, workers=2, progress=False) == serial


def test_guess_source_of_unknown_file(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"")
    with pytest.raises(FacetrainError, match="cannot tell"):
        guess_source(tmp_path / "x.bin")


def test_bench_data_writes_json_and_a_table(tmp_path):
    out = tmp_path / "bench" / "data.json"
    result = invoke("bench", "data", "--images", 12, "--identities", 3, "--repeats", 1, "--out", out)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [row["source"] for row in report["rows"]] == ["folder", "recordio"]
    for row in report["rows"]:
        rates = [row[stage]["median_images_per_s"] for stage in ("read", "read_decode", "full")]
        assert all(rate > 0 for rate in rates) and rates[0] > rates[2]
        verdict = "PASS" if row["full"]["median_images_per_s"] >= 1500 else "MISS"
        assert row["pass"] == (verdict == "PASS")
        assert f"| {row['source']} |" in result.output and verdict in result.output
    assert report["machine"]["cores"] >= 1 and report["settings"]["images"] == 12
    assert "--overwrite" in one_line_error(invoke("bench", "data", "--images", 12, "--out", out))
