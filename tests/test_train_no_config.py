"""`facetrain train` without -c says in one line what the defaults will do, and where to start instead."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from facetrain.cli import main

REPO = Path(__file__).resolve().parents[1]

# --set only, as a newcomer would shrink the defaults: the run itself takes a second
TINY = {
    "model.backbone": "small",
    "model.embedding_size": "32",
    "train.batch_size": "8",
    "train.steps": "1",
    "data.image_size": "[32,32]",
    "data.num_workers": "0",
    "data.synth.identities": "8",
    "data.synth.images_per_identity": "4",
    "data.synth.heldout_identities": "4",
    "data.synth.pairs_folds": "2",
    "data.synth.pairs_per_fold": "4",
    "data.synth.heldout_images_per_identity": "2",
    "data.synth.image_size": "32",
}


def test_a_run_without_config_says_what_it_will_do_and_where_to_start(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(REPO)  # configs/ is where a checkout's newcomer runs from
    synth = tmp_path / "synth"
    words = [f"--set={key}={value}" for key, value in TINY.items()]
    args = ["train", "-o", str(tmp_path / "run"), "-q", *words, f"--set=data.path={synth}"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.output.splitlines() if line.startswith("note: no config")]
    assert len(notes) == 1, result.output
    assert "training small at batch 8 a rank on " in notes[0]
    assert f"after generating 40 synthetic 32x32 faces into {synth}" in notes[0]
    assert "-c configs/demo.yaml" in notes[0] and "-c configs/laptop.yaml" in notes[0]
    assert "`facetrain config`" in notes[0]
    assert (synth / "train").is_dir() and (tmp_path / "run" / "checkpoints" / "last").is_file()


def test_a_run_with_a_config_has_no_such_note(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("train:\n  steps: 0\n")  # refused before anything runs: the note would come first
    result = CliRunner().invoke(main, ["train", "-c", str(config)])
    assert result.exit_code == 2 and "note: no config" not in result.output
