"""Bad inputs of issue 25's second half, through the real CLI on real files: resuming on other classes
(item 9), a decompression-bomb PNG (item 11), unreadable files in `embed` and `pairs`, OpenCV's own
log lines (item 13), and the bad-input sweep itself."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from facetrain.checkpoint import find_resume_point, load_full_head
from facetrain.data.decode import BadImageError, decode_image
from facetrain.data.image_header import MAX_IMAGE_PIXELS
from tests.support import bad_files
from tests.support.fault_helpers import error_lines
from tests.support.train_helpers import REPO, run_cli

LIMIT = f"over facetrain's limit of {MAX_IMAGE_PIXELS / 1e6:.0f} megapixels"


def copied_run(finished_run: Path, tmp_path: Path) -> Path:
    """The finished run in tmp_path, with its training classes as a plain image folder tmp_path/other."""
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(finished_run), str(tmp_path)))
    shutil.copytree(tmp_path / "synth" / "train", tmp_path / "other")
    return config


def test_resuming_on_other_classes_is_refused_naming_the_first_difference(finished_run, tmp_path):
    """Same count, one identity renamed: before, the run went on with rows meaning other people."""
    config = copied_run(finished_run, tmp_path)
    (tmp_path / "other" / "id00003").rename(tmp_path / "other" / "zed")
    classes = (tmp_path / "run" / "classes.json").read_text()
    result = run_cli(
        "train", "-c", str(config), "--resume", "auto", "--set", "data.source=folder",
        "--set", f"data.path={tmp_path / 'other'}", "--set", "train.steps=3",
    )  # fmt: skip
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"error: checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_00000002'} was trained on other classes "
        f"than data.path {tmp_path / 'other'}: class 3 is 'id00003' there and 'id00004' here (12 classes "
        "there, 12 here), so its head rows would train other identities; resume on the data it was trained "
        "with, or pass --set train.remap_classes=true to keep the rows of the classes in both by name and "
        "start the others fresh"
    ]
    assert (tmp_path / "run" / "classes.json").read_text() == classes
    assert find_resume_point(tmp_path / "run")[0].name == "step_00000002"


def test_remap_classes_keeps_each_row_with_its_class_and_starts_new_ones_fresh(finished_run, tmp_path):
    """One identity gone, one new: the 11 shared rows move with their names (lr ~0 keeps them put)."""
    config = copied_run(finished_run, tmp_path)
    (tmp_path / "other" / "id00003").rename(tmp_path / "other" / "zed")
    before = load_full_head(tmp_path / "run")
    old_names = json.loads((tmp_path / "run" / "classes.json").read_text())
    result = run_cli(
        "train", "-c", str(config), "--resume", "auto", "--set", "data.source=folder",
        "--set", f"data.path={tmp_path / 'other'}", "--set", "train.steps=3", "--set", "optim.lr=1e-12",
        "--set", "train.remap_classes=true",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "11 classes kept, 1 new (fresh rows), 1 dropped (no longer in the data)" in result.stdout
    new_names = json.loads((tmp_path / "run" / "classes.json").read_text())
    assert new_names[-1] == "zed" and "id00003" not in new_names
    after = load_full_head(tmp_path / "run")
    for row, name in enumerate(new_names[:-1]):
        torch.testing.assert_close(after[row], before[old_names.index(name)], atol=1e-6, rtol=0)
    assert not torch.allclose(after[-1], before[old_names.index("id00003")], atol=1e-3)


def test_a_decompression_bomb_is_refused_from_its_header_at_once(tmp_path):
    """The issue's 30000x30000 one-bit PNG of ~110 KB: before, decoding it took > 100 s."""
    bomb = bad_files.huge_png(tmp_path / "bomb.png")
    assert bomb.stat().st_size < 200_000
    started = time.monotonic()
    with pytest.raises(BadImageError) as refused:
        decode_image(bomb)
    assert time.monotonic() - started < 1.0
    assert str(refused.value) == f"image {bomb} is 30000x30000 pixels (900 megapixels), {LIMIT}; downscale it"


def test_align_skips_a_decompression_bomb_and_names_it(tmp_path):
    source = tmp_path / "photos"
    source.mkdir()
    bomb = bad_files.huge_png(source / "bomb.png")
    notes = bad_files.text_named_like_an_image(source / "notes.jpg")
    bad_files.noise_png(source / "noise.png")
    started = time.monotonic()
    result = run_cli("align", str(source), "-o", str(tmp_path / "aligned"), "--workers", "1", "--quiet")
    assert time.monotonic() - started < 60
    assert result.returncode == 0, result.stderr
    assert "2 unreadable skipped" in result.stdout
    assert error_lines(result.stderr) == [
        f"warning: left out image {bomb} is 30000x30000 pixels (900 megapixels), {LIMIT}; downscale it",
        f"warning: left out image {notes} is corrupt or not an image",
    ]


def test_embed_leaves_out_unreadable_files_and_names_them_without_opencv_lines(finished_run, tmp_path):
    """Before, one unreadable file stopped the whole batch after embedding everything before it."""
    folder = tmp_path / "faces"
    folder.mkdir()
    good = sorted((finished_run / "synth" / "heldout").glob("*/*.png"))[:4]
    for image in good:
        shutil.copy(image, folder / image.name)
    cut = bad_files.cut_png(folder / "cut.png")
    notes = bad_files.text_named_like_an_image(folder / "notes.jpg")
    out = tmp_path / "faces.npy"
    result = run_cli("embed", str(finished_run / "run"), str(folder), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("; left out 2 unreadable images")
    assert [line for line in error_lines(result.stderr) if not line.startswith("embedding images:")] == [
        f"warning: left out image {cut} is corrupt or not an image",
        f"warning: left out image {notes} is corrupt or not an image",
    ]
    assert not any(marker in result.stderr for marker in ("[ WARN", "[ERROR", "libpng"))
    assert np.load(out).shape[0] == 4
    assert out.with_suffix(".paths.txt").read_text().splitlines() == [str(folder / i.name) for i in good]


def test_compare_a_cut_short_png_is_one_line_without_opencv_lines(finished_run, tmp_path):
    good = next((finished_run / "synth" / "heldout").glob("*/*.png"))
    cut = bad_files.cut_png(tmp_path / "cut.png")
    result = run_cli("compare", str(finished_run / "run"), str(good), str(cut), "--threshold", "0.3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: image {cut} is corrupt or not an image"]


def test_pairs_make_leaves_out_files_that_are_not_images_and_names_them(finished_run, tmp_path):
    root = tmp_path / "people"
    for identity in sorted((finished_run / "synth" / "heldout").iterdir())[:2]:
        shutil.copytree(identity, root / identity.name)
    notes = bad_files.text_named_like_an_image(root / identity.name / "notes.jpg")
    empty = bad_files.empty_file(root / identity.name / "empty.png")
    out = tmp_path / "pairs.csv"
    result = run_cli("pairs", str(root), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert error_lines(result.stderr) == [
        f"warning: left out image {empty} is corrupt or not an image",
        f"warning: left out image {notes} is corrupt or not an image",
    ]
    with out.open() as handle:
        listed = {row[column] for row in csv.DictReader(handle) for column in ("path1", "path2")}
    assert listed and not any(name.endswith(("notes.jpg", "empty.png")) for name in listed)


def test_the_bad_input_sweep_runs_cases_without_findings(tmp_path, monkeypatch, capsys):
    """A handful of cases of tools/bad_input_sweep.py; its full run is in docs/reliability.md. Its main
    runs in this process, which has imported what it needs; the cases still run in the worker process
    it starts, as they do from a shell."""
    report = tmp_path / "sweep.json"
    spec = importlib.util.spec_from_file_location("bad_input_sweep", REPO / "tools" / "bad_input_sweep.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    monkeypatch.setattr(sys, "argv", [
        "bad_input_sweep.py", "--cases", "24", "--seed", "5", "--out", str(report), "--work", str(tmp_path / "work"),
    ])  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        tool.main()
    assert exited.value.code == 0, capsys.readouterr().out
    outcome = json.loads(report.read_text())
    assert outcome["cases"] == 24 and outcome["findings"] == []
    assert len(outcome["commands"]) >= 5
