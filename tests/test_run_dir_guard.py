"""Nothing of the user's is lost to a write: one writer a run directory, no training into a folder that
is not a run, and `--overwrite` replacing only what facetrain wrote. Real processes and real files.
"""

from __future__ import annotations

import csv
import hashlib
import shutil
import signal
import socket
from pathlib import Path

import pytest

from facetrain.checkpoint import find_resume_point
from facetrain.checkpoint.run_dir import RUN_MARKER, check_run_dir, is_run_dir
from facetrain.data.config import SynthConfig
from facetrain.data.synthetic import generate_synthetic
from facetrain.errors import FacetrainError
from facetrain.run_lock import LOCK_NAME
from tests.support.fault_helpers import error_lines, kill_all, signal_group, start, wait_for_step
from tests.support.train_helpers import run_cli, run_cli_at_once, tiny_config


def tree(folder: Path) -> dict[str, str]:
    """Every file under `folder` by relative path, with a hash of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_second_run_into_a_busy_run_directory_is_refused_naming_the_holder(tmp_path):
    slow = tiny_config(tmp_path, "run", train={"steps": 100000}, checkpoint={"every": 100000})
    other = tiny_config(tmp_path, "other", train={"output_dir": str(tmp_path / "run"), "seed": 7})
    run = tmp_path / "run"
    first = start("train", "-c", str(slow))
    try:
        wait_for_step(first, run, 1)
        # paused, it still holds its flock, and the refusals below do not wait for cores it is using
        signal_group(first, signal.SIGSTOP)
        holder = f"facetrain train (PID {first.pid} on host {socket.gethostname()}, since "
        commands = {
            "train": ("train", "-c", str(other)),
            "resume": ("train", "-c", str(other), "--resume", "auto"),
            "launcher": ("train", "-c", str(other), "--nproc", "2"),
            "eval": ("eval", str(run), "--folder", str(tmp_path / "synth" / "heldout"), "--quiet"),
            "export": ("export", str(run), "-o", str(run / "export"), "--quiet"),
        }
        refusals = dict(zip(commands, run_cli_at_once(*commands.values())))
        for name, result in refusals.items():
            assert result.returncode == 2, (name, result.stderr)
            [line] = error_lines(result.stderr)
            assert line.startswith(f"error: {run} is in use by {holder}"), (name, line)
        assert (
            refusals["train"]
            .stderr.rstrip()
            .endswith("; wait for it to finish or stop it, or choose another train.output_dir")
        )
        assert (
            refusals["eval"]
            .stderr.rstrip()
            .endswith("; wait for it to finish, or pass --out to write the report elsewhere")
        )
        assert not (run / "eval").exists() and not (run / "export").exists()
        assert not (run / "checkpoints").exists()
        with (run / "metrics.csv").open() as handle:
            steps = [int(row["step"]) for row in csv.DictReader(handle)]
        assert steps == list(range(1, len(steps) + 1)), "only the first run's rows, in order"

        first.send_signal(signal.SIGKILL)  # the lock dies with its holder: no stale lock
        first.wait(timeout=30)
        resumed = run_cli("train", "-c", str(other), "--resume", "auto", "--set", "train.steps=2")
        assert resumed.returncode == 0, resumed.stderr
    finally:
        kill_all(first)


def test_a_folder_of_the_users_is_refused_before_anything_is_written(tmp_path):
    mine = tmp_path / "mine"
    (mine / "photos").mkdir(parents=True)
    (mine / "photos" / "me.jpg").write_bytes(b"\xff\xd8 not really")
    (mine / "thesis.txt").write_text("four years of work")
    (mine / "metrics.csv").write_text("date,weight\n2024-01-01,70\n")
    before = tree(mine)
    config = tiny_config(tmp_path, "run", train={"steps": 1, "output_dir": str(mine)})
    extras = ([], ["--nproc", "2"], ["--resume", "auto"])
    for result in run_cli_at_once(*(("train", "-c", str(config), *extra) for extra in extras)):
        assert result.returncode == 2, result.stderr
        assert error_lines(result.stderr) == [
            f"error: train.output_dir {mine} is not a facetrain run and holds files of its own (first: "
            f"{mine / 'metrics.csv'}); training would write among them: choose a new or empty folder"
        ]
        assert tree(mine) == before and sorted(p.name for p in mine.iterdir()) == [
            "metrics.csv", "photos", "thesis.txt",
        ]  # fmt: skip


def test_a_run_from_before_the_marker_still_resumes(finished_run, tmp_path):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(finished_run), str(tmp_path)))
    run = tmp_path / "run"
    assert (run / RUN_MARKER).is_file()
    (run / RUN_MARKER).unlink()
    (run / LOCK_NAME).unlink()
    assert is_run_dir(run)
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=3")
    assert result.returncode == 0, result.stderr
    assert f"resumed from {run / 'checkpoints' / 'step_00000002'} at step 2" in result.stdout + result.stderr
    assert (run / RUN_MARKER).is_file(), "marked from now on"

    for kept in ("config.yaml", "metrics.csv"):  # a run that stopped before its first checkpoint
        alone = tmp_path / f"only_{kept}"
        alone.mkdir()
        shutil.copy(run / kept, alone / kept)
        check_run_dir(alone)


def test_synth_overwrite_replaces_only_its_own_set(tmp_path):
    out = tmp_path / "usersyn"
    small = ["--identities", "2", "--images-per-identity", "2", "--heldout-identities", "2"]
    small += ["--heldout-images-per-identity", "2", "--pairs-folds", "1", "--pairs-per-fold", "1"]
    small += ["--image-size", "16"]
    assert run_cli("synth", "-o", str(out), *small).returncode == 0
    (out / "photos").mkdir()
    (out / "photos" / "me.jpg").write_bytes(b"\xff\xd8 mine")
    (out / "thesis.txt").write_text("four years of work")
    (out / "train" / "id00000" / "notes.txt").write_text("which one is me")
    before = tree(out)
    result = run_cli("synth", "-o", str(out), *small, "--seed", "1", "--overwrite")
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"error: {out / 'photos'} was not written by facetrain synth, and --overwrite replaces only a "
        f"synthetic set facetrain wrote: move it out of {out}, or choose another folder"
    ]
    assert tree(out) == before
    settings = SynthConfig(2, 2, 2, 2, pairs_folds=1, pairs_per_fold=1, image_size=16, seed=1)
    for foreign in ("photos", "thesis.txt", "train/id00000/notes.txt"):
        with pytest.raises(FacetrainError, match=f"^{out / foreign} was not written by facetrain synth"):
            generate_synthetic(out, settings, overwrite=True, progress=False)
        assert tree(out) == before
        shutil.rmtree(out / foreign) if (out / foreign).is_dir() else (out / foreign).unlink()
        before = tree(out)

    result = run_cli("synth", "-o", str(out), *small, "--seed", "1", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert tree(out) != before and sorted(p.name for p in tmp_path.iterdir()) == ["usersyn"]


def test_import_overwrite_never_replaces_a_training_checkpoint(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    checkpoint = find_resume_point(run)[0]
    elsewhere = tmp_path / "copied_checkpoint"
    shutil.copytree(checkpoint, elsewhere)
    before = tree(run), tree(elsewhere)
    source = tmp_path / "backbone.pth"  # never read: the destination is refused first
    source.write_bytes(b"")
    into_run = run_cli(
        "import", "insightface", str(source), "--arch", "iresnet18", "-o", str(checkpoint), "--overwrite"
    )
    assert error_lines(into_run.stderr) == [
        f"error: -o {checkpoint} lies in the checkpoints folder of the training run {run}, where an "
        "import would pass for one of its checkpoints; choose another -o"
    ]
    over_copy = run_cli(
        "import", "insightface", str(source), "--arch", "iresnet18", "-o", str(elsewhere), "--overwrite"
    )
    assert error_lines(over_copy.stderr) == [
        f"error: -o {elsewhere} exists and is not an earlier import; --overwrite only replaces an earlier "
        "import, so choose another -o"
    ]
    assert (into_run.returncode, over_copy.returncode) == (2, 2)
    assert (tree(run), tree(elsewhere)) == before
