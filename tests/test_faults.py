"""Faults a run survives, one process: nothing a user made is lost, and every problem is one line.

Checkpoints without a `last` pointer, damaged and tampered checkpoint files, a resume with other model
settings, a user's own config.yaml, a failing verification, a full disk and a read-only folder, and
Ctrl-C. Stop signals with loader workers, to launchers and to every process are in
test_stop_signals.py, Slurm's in test_slurm.py. The multi-rank faults are in test_faults_ranks.py,
kill -9 during checkpoint writes in test_faults_kill.py, the long run killed three times in
test_faults_soak.py.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from facetrain.checkpoint import find_resume_point
from facetrain.checkpoint.layout import find_damage
from facetrain.checkpoint.resume_point import find_checkpoint_to_resume, restarted_job
from facetrain.checkpoint.run_dir import RUN_CONFIG_HEADER, check_run_dir
from facetrain.errors import FacetrainError
from facetrain.interop import load_model
from tests.support.fault_helpers import (
    ENV,
    assert_same_checkpoint,
    error_lines,
    start,
    wait_for_step,
)
from tests.support.train_helpers import REPO, run_cli, tiny_config, trained_tiny_run

STEPS = 6


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A 6-step run with checkpoints at steps 2, 4 and 6 (copied by the tests that damage it)."""
    return trained_tiny_run(tmp_path_factory.mktemp("finished"), steps=STEPS, every=2)


def copy_run(finished_run: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(finished_run), str(tmp_path)))
    return tmp_path / "run"


def test_step_dirs_without_a_last_pointer_are_a_run_and_resume_from_the_newest(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    (run / "checkpoints" / "last").unlink()
    with pytest.raises(FacetrainError, match="already holds checkpoints; pass --resume auto"):
        find_checkpoint_to_resume(run, None)
    checkpoint, notes = find_checkpoint_to_resume(run, "auto")
    assert checkpoint.name == "step_00000006"
    assert notes == [f"{run / 'checkpoints' / 'last'} is missing; taking the newest finished checkpoint"]
    result = run_cli("train", "-c", str(tmp_path / "run.yaml"))
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"error: {run} already holds checkpoints; pass --resume auto to continue that run, "
        "or choose another train.output_dir"
    ]


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_truncated_distcp_is_named_in_one_line_and_auto_resume_falls_back(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    newest = run / "checkpoints" / "step_00000006"
    truncate(newest / "__0_0.distcp")
    damage = f"data file {newest / '__0_0.distcp'} is cut short"
    assert find_damage(newest).startswith(damage)
    with pytest.raises(FacetrainError) as caught:
        load_model(newest)
    assert str(caught.value) == (
        f"cannot read checkpoint data {newest / '__0_0.distcp'} (EOFError): the file is damaged; "
        "use another checkpoint"
    )

    checkpoint, notes = find_resume_point(run)
    assert checkpoint.name == "step_00000004"
    assert len(notes) == 1 and notes[0].startswith(f"skipping damaged checkpoint step_00000006: {damage}")

    result = run_cli("train", "-c", str(tmp_path / "run.yaml"), "--resume", str(newest))
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert line.startswith(f"error: checkpoint {newest} is damaged: {damage}")
    assert line.endswith(
        f"resume from the one before it with --resume {run / 'checkpoints' / 'step_00000004'}"
    )

    result = run_cli("train", "-c", str(tmp_path / "run.yaml"), "--resume", "auto", "--set", "train.steps=8")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    [note] = [line for line in lines if line.startswith("note: ")]
    assert note.startswith(f"note: skipping damaged checkpoint step_00000006: {damage}")
    assert f"resumed from {run / 'checkpoints' / 'step_00000004'} at step 4" in lines


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch facetrain-exploit-ran",))


def test_a_malicious_distcp_is_refused_in_one_line_without_running_it(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    data_file = run / "checkpoints" / "step_00000006" / "__0_0.distcp"
    payload = pickle.dumps(_Exploit())
    data = bytearray(data_file.read_bytes())
    data[: len(payload)] = payload  # the first tensor's bytes become a pickle that runs a command
    data_file.write_bytes(bytes(data))
    with pytest.raises(FacetrainError) as caught:
        load_model(data_file.parent)
    assert str(caught.value) == (
        f"refusing checkpoint data {data_file}: it holds something other than plain tensors "
        "(tampered or not written by facetrain); use another checkpoint"
    )
    result = run_cli(
        "eval",
        str(data_file.parent),
        "--pairs",
        str(tmp_path / "synth" / "heldout" / "pairs.txt"),
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert error_lines(result.stderr)[-1].startswith(f"error: refusing checkpoint data {data_file}")
    assert "weights_only" not in result.stderr
    assert not (tmp_path / "facetrain-exploit-ran").exists() and not (REPO / "facetrain-exploit-ran").exists()


@pytest.mark.parametrize(
    "override, trained_with",
    [
        ("data.image_size=[40, 40]", "data.image_size=[32, 32]"),
        ("model.backbone=r18", "model.backbone=small"),
    ],
)
def test_resuming_with_another_model_is_one_line(finished_run, tmp_path, override, trained_with):
    run = copy_run(finished_run, tmp_path)
    result = run_cli(
        "train",
        "-c",
        str(tmp_path / "run.yaml"),
        "--resume",
        "auto",
        "--set",
        override,
        "--set",
        "train.steps=8",
    )
    assert result.returncode == 2
    [line] = error_lines(result.stderr)
    assert line.startswith(f"error: checkpoint {run / 'checkpoints' / 'step_00000006'} was trained with ")
    assert trained_with in line and "does not fit this run's backbone" in line
    assert "size mismatch" not in result.stderr and "Traceback" not in result.stderr


def test_a_users_config_yaml_in_the_output_dir_is_never_replaced(tmp_path):
    config = tiny_config(tmp_path, "run", train={"steps": 1})
    own = tmp_path / "run" / "config.yaml"
    own.parent.mkdir()
    own.write_text("# my notes for this experiment\ntrain: {steps: 1}\n")
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"error: {own} was not written by facetrain and training would replace it; move it out of "
        "train.output_dir, or choose another train.output_dir"
    ]
    assert own.read_text() == "# my notes for this experiment\ntrain: {steps: 1}\n"

    own.unlink()
    assert run_cli("train", "-c", str(config)).returncode == 0
    assert own.read_text().startswith(RUN_CONFIG_HEADER)
    check_run_dir(own.parent)  # facetrain's own file may be replaced: a resumed run rewrites it
    result = run_cli("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=2")
    assert result.returncode == 0, result.stderr
    assert "steps: 2" in own.read_text()


def test_a_torchrun_restart_resumes_only_its_own_job(finished_run, tmp_path, monkeypatch):
    run = copy_run(finished_run, tmp_path)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert not restarted_job(run)  # a first attempt
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "another-job")
    assert not restarted_job(run)  # the checkpoints are an earlier job's: refuse as usual
    with pytest.raises(FacetrainError, match="already holds checkpoints"):
        find_checkpoint_to_resume(run, None)
    meta = run / "checkpoints" / "step_00000006" / "meta.json"
    meta.write_text(meta.read_text().replace('"elastic_run_id": null', '"elastic_run_id": "this-job"'))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "this-job")
    assert restarted_job(run)
    assert find_checkpoint_to_resume(run, None)[0].name == "step_00000006"


def test_a_slurm_requeue_resumes_only_its_own_job(finished_run, tmp_path, monkeypatch):
    run = copy_run(finished_run, tmp_path)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    assert not restarted_job(run)  # the job's first start: an earlier run's checkpoints are refused
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert not restarted_job(run)  # requeued, but the checkpoints are not this job's
    meta = run / "checkpoints" / "step_00000006" / "meta.json"
    meta.write_text(meta.read_text().replace('"slurm_job_id": null', '"slurm_job_id": "4242"'))
    assert restarted_job(run)
    assert find_checkpoint_to_resume(run, None)[0].name == "step_00000006"


def corrupt_a_pairs_image(tmp: Path) -> Path:
    pairs = tmp / "synth" / "heldout" / "pairs.txt"
    identity, number = pairs.read_text().splitlines()[1].split("\t")[:2]
    image = next((tmp / "synth" / "heldout" / identity).glob(f"*{int(number):04d}.*"))
    image.write_bytes(b"not an image")
    return image


@pytest.mark.parametrize("every, failing_step", [(3, 3), (0, 6)], ids=["mid-run", "after-the-last-step"])
def test_a_failing_verification_loses_no_checkpoint_and_is_one_line(
    finished_run, tmp_path, every, failing_step
):
    """Verified every 3 steps, or only after the last step (eval.every=0), where the issue's run lost
    its final checkpoint; either way every checkpoint is written before the run ends with the error."""
    shutil.copytree(finished_run / "synth", tmp_path / "synth")
    image = corrupt_a_pairs_image(tmp_path)
    pairs = tmp_path / "synth" / "heldout" / "pairs.txt"
    config = tiny_config(
        tmp_path,
        "run",
        train={"steps": 6},
        checkpoint={"every": 6},
        eval={"pairs": str(pairs), "every": every},
    )
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 2
    reason = (
        f"verification at step {failing_step} failed: image {image} is corrupt or not an image; fix the image "
        "or drop its pairs from eval.pairs"
    )
    assert f"warning: {reason}; training goes on without verification" in result.stdout.splitlines()
    assert error_lines(result.stderr) == [
        f"error: {reason}; training itself finished and its checkpoints are in {tmp_path / 'run' / 'checkpoints'}: "
        "fix eval.pairs, then run facetrain eval on the checkpoint"
    ]
    assert "skip_bad_images" not in result.stderr
    assert find_resume_point(tmp_path / "run")[0].name == "step_00000006"


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_earlier_ones_resume_exactly(
    finished_run, tmp_path
):
    config = tiny_config(tmp_path, "run", train={"steps": STEPS}, checkpoint={"every": 2})
    result = run_cli("disk-full", "2", "train", "-c", str(config), module="tests.support.fault_injection")
    assert result.returncode == 2
    checkpoints = tmp_path / "run" / "checkpoints"
    assert error_lines(result.stderr)[-1] == (
        f"error: cannot write checkpoint {checkpoints / 'step_00000004'}: No space left on device "
        f"({checkpoints / 'step_00000004.tmp' / '__0_0.distcp'}); the last complete one, step_00000002, is "
        "intact. Free space, then resume with --resume auto"
    )
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last", "step_00000002"]
    result = run_cli("train", "-c", str(config), "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert_same_checkpoint(tmp_path / "run", finished_run / "run")


def _private_tmpfs_works() -> bool:
    probe = (
        subprocess.run(["unshare", "-rm", "true"], capture_output=True) if shutil.which("unshare") else None
    )
    return probe is not None and probe.returncode == 0


@pytest.mark.skipif(not _private_tmpfs_works(), reason="no unprivileged user namespace to mount a tmpfs in")
def test_a_real_full_disk_and_a_read_only_folder(tmp_path):
    """A 7 MB tmpfs holds one checkpoint of the small model (4.5 MB) but not two; a read-only one
    holds nothing. Mounted in a private namespace, so the test needs no privileges."""
    full, read_only, kept = tmp_path / "full", tmp_path / "read_only", tmp_path / "kept"
    for folder in (full, read_only):
        folder.mkdir()
    config = tiny_config(
        tmp_path, "run", train={"steps": STEPS, "output_dir": str(full / "run")}, checkpoint={"every": 2}
    )
    python = f"{sys.executable} -m facetrain"
    script = f"""
        mount -t tmpfs -o size=7m tmpfs {full} && mount -t tmpfs -o ro,size=1m tmpfs {read_only} || exit 99
        {python} train -c {config} 2> {tmp_path / "full.err"}; echo $? > {tmp_path / "full.rc"}
        cp -r {full / "run"} {kept}
        {python} train -c {config} --set train.output_dir={read_only / "run"} 2> {tmp_path / "ro.err"}
        echo $? > {tmp_path / "ro.rc"}
    """
    subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=ENV, timeout=300, check=True)
    assert (tmp_path / "full.rc").read_text().strip() == "2"
    [line] = [line for line in error_lines((tmp_path / "full.err").read_text()) if line.startswith("error:")]
    assert line.startswith(
        f"error: cannot write checkpoint {full / 'run' / 'checkpoints' / 'step_00000004'}: No space left on device"
    )
    assert "the last complete one, step_00000002, is intact" in line
    assert find_damage(kept / "checkpoints" / "step_00000002") is None
    assert find_resume_point(kept)[0].name == "step_00000002"

    assert (tmp_path / "ro.rc").read_text().strip() == "2"
    assert error_lines((tmp_path / "ro.err").read_text()) == [
        f"error: cannot write to train.output_dir {read_only / 'run'}: Read-only file system "
        f"({read_only / 'run'}); choose a writable folder with free space"
    ]


def test_ctrl_c_checkpoints_and_exits_0_and_the_run_resumes_exactly(finished_run, tmp_path):
    """SIGINT to the process alone; SIGTERM and SIGUSR1, loader workers and every process of a run
    signalled at once are in test_stop_signals.py."""
    sig = signal.SIGINT
    config = tiny_config(tmp_path, "run", train={"steps": STEPS}, checkpoint={"every": 2})
    slow = tiny_config(
        tmp_path,
        "slow",
        train={"steps": 100000, "output_dir": str(tmp_path / "run")},
        checkpoint={"every": 100000},
    )
    process = start("train", "-c", str(slow))
    wait_for_step(process, tmp_path / "run", 1)
    process.send_signal(sig)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert error_lines(stderr) == []
    stopped = stdout.splitlines()[-1]
    assert stopped.startswith("stopped at step ") and stopped.endswith(
        f"by {sig.name}; resume with: facetrain train -c {slow} --resume auto"
    )
    step = int(stopped.split()[3])
    assert find_resume_point(tmp_path / "run")[0].name == f"step_{step:08d}"
    assert step < STEPS  # the current step finishes, then the run stops
    result = run_cli("train", "-c", str(config), "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert_same_checkpoint(tmp_path / "run", finished_run / "run")
