"""A scheduler's variables set wrong (#57, environment): restart counts that are no number, job ids that
name a path or carry a newline, a restart count without its job id, a rank without a world. Each is one
line before any rank starts, where they were a ValueError traceback (under `--nproc 2` a bare "rank 0
exited with code 1"), a run folder outside `runs/`, another run's checkpoints taken over, or a run that
trained in silence."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from facetrain.checkpoint.resume_point import restarted_job
from facetrain.errors import FacetrainError
from facetrain.job_env import check_job_env
from facetrain.parallel.dims import init_parallel
from facetrain.parallel.launch import explain_failures
from tests.support.fault_helpers import error_lines
from tests.support.train_helpers import REPO, run_cli, tiny_config

SCHEDULER_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
)
COUNT_RULE = "is not a restart count (a whole number from 0 to 1000000); the scheduler sets it: unset it to start the run yourself"
ID_RULE = (
    "is not a job id (letters, digits, '_', '+', '-' and single dots, at most 128); the scheduler sets it: "
    "unset it to start the run yourself"
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*SCHEDULER_VARIABLES, "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("SLURM_RESTART_COUNT", "abc", f"environment variable SLURM_RESTART_COUNT='abc' {COUNT_RULE}"),
        ("SLURM_RESTART_COUNT", "1.5", f"environment variable SLURM_RESTART_COUNT='1.5' {COUNT_RULE}"),
        ("SLURM_RESTART_COUNT", "-1", f"environment variable SLURM_RESTART_COUNT='-1' {COUNT_RULE}"),
        ("SLURM_RESTART_COUNT", "9" * 30, f"environment variable SLURM_RESTART_COUNT='{'9' * 30}' {COUNT_RULE}"),
        ("TORCHELASTIC_RESTART_COUNT", "abc", f"environment variable TORCHELASTIC_RESTART_COUNT='abc' {COUNT_RULE}"),
        ("TORCHELASTIC_RESTART_COUNT", "²", f"environment variable TORCHELASTIC_RESTART_COUNT='²' {COUNT_RULE}"),
        ("SLURM_JOB_ID", "1/../../../escaped", f"environment variable SLURM_JOB_ID='1/../../../escaped' {ID_RULE}"),
        ("SLURM_JOB_ID", "..", f"environment variable SLURM_JOB_ID='..' {ID_RULE}"),
        ("SLURM_JOB_ID", "7\ninjected", f"environment variable SLURM_JOB_ID='7\\ninjected' {ID_RULE}"),
        ("TORCHELASTIC_RUN_ID", "a/b", f"environment variable TORCHELASTIC_RUN_ID='a/b' {ID_RULE}"),
    ],
)  # fmt: skip
def test_each_bad_scheduler_variable_is_one_line(clean_env, name, value, message):
    clean_env.setenv(name, value)
    with pytest.raises(FacetrainError) as error:
        check_job_env()
    assert str(error.value) == message


def test_good_scheduler_variables_pass(clean_env):
    for name, value in {"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "3", "TORCHELASTIC_RESTART_COUNT": "0",
                        "TORCHELASTIC_RUN_ID": "none"}.items():  # fmt: skip
        clean_env.setenv(name, value)
    check_job_env()


@pytest.mark.parametrize("nproc", ["2"])
def test_a_restart_count_that_is_no_number_stops_train_in_one_line_before_any_rank(
    clean_env, tmp_path, nproc
):
    """Under --nproc 2 the launcher printed only "rank 0 exited with code 1 (its traceback is above)"."""
    clean_env.setenv("SLURM_RESTART_COUNT", "abc")
    result = run_cli("train", "-c", str(tiny_config(tmp_path)), "--nproc", nproc)
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        f"error: environment variable SLURM_RESTART_COUNT='abc' {COUNT_RULE}"
    ]
    assert not (tmp_path / "run").exists()


def test_a_restart_count_without_its_job_id_takes_over_nothing(clean_env, finished_run, tmp_path):
    """A run started by hand has no job id in its checkpoints; a restart count alone (no SLURM_JOB_ID)
    named no job, so None == None took the run over as if this job had written it."""
    run = tmp_path / "run"
    shutil.copytree(finished_run / "run", run)
    clean_env.setenv("SLURM_RESTART_COUNT", "1")
    assert not restarted_job(run)
    clean_env.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert not restarted_job(run)


@pytest.mark.parametrize("env", [{"RANK": "1"}, {"LOCAL_RANK": "1"}, {"RANK": "1", "WORLD_SIZE": "1"}])
def test_a_rank_without_a_world_is_one_line(clean_env, env):
    """RANK=1 without WORLD_SIZE trained as a single process that printed and logged nothing."""
    for name, value in env.items():
        clean_env.setenv(name, value)
    [(name, value)] = [(n, v) for n, v in env.items() if n != "WORLD_SIZE"]
    alone = "with WORLD_SIZE=1" if "WORLD_SIZE" in env else "without WORLD_SIZE"
    with pytest.raises(FacetrainError) as error:
        init_parallel(backend="gloo")
    assert str(error.value) == (
        f"environment variable {name}={value} is set {alone}, and a single process is rank 0; unset {name}, "
        "or start the ranks with torchrun or `facetrain train --nproc N`"
    )


@pytest.mark.parametrize("script", ["train.sbatch", "train_multinode.sbatch"])
@pytest.mark.parametrize("job_id", ["1/../../../escaped", "7\ninjected line", ""])
def test_the_slurm_scripts_refuse_a_job_id_that_is_no_number(tmp_path, script, job_id):
    env = {
        **os.environ,
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": "x",
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
    }
    for tool in ("srun", "scontrol", "torchrun"):  # if reached, they would say so
        (tmp_path / tool).write_text(f"#!/bin/sh\necho {tool} ran\n")
        (tmp_path / tool).chmod(0o755)
    result = subprocess.run(["bash", str(REPO / "facetrain" / "cli" / "slurm" / script), "-c", "x.yaml"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        f"{script}: SLURM_JOB_ID={shlex_quote_like_bash(job_id)} is not a Slurm job id (digits); submit "
        "this script with sbatch"
    ]
    assert not (tmp_path / "runs").exists()


def shlex_quote_like_bash(value: str) -> str:
    return subprocess.run(["bash", "-c", 'printf %q "$1"', "_", value], capture_output=True, text=True).stdout


def test_the_slurm_script_names_the_run_folder_inside_runs(tmp_path):
    """A job name is the user's free text: '/' in it no longer leaves runs/."""
    env = {**os.environ, "SLURM_JOB_ID": "123", "SLURM_JOB_NAME": "a/../../b", "PATH": f"{tmp_path}:{os.environ['PATH']}"}  # fmt: skip
    (tmp_path / "srun").write_text('#!/bin/sh\necho "$@"\n')
    (tmp_path / "srun").chmod(0o755)
    result = subprocess.run(["bash", str(REPO / "facetrain" / "cli" / "slurm" / "train.sbatch"), "-c", "x.yaml"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)  # fmt: skip
    assert "-o runs/a_.._.._b-123" in result.stdout, result.stdout
    assert Path(tmp_path / "runs").exists() is False


def test_a_ranks_unexpected_error_under_nproc_shows_its_traceback(tmp_path):
    """The launcher said "rank 0 exited with code 1 (its traceback is above)" above nothing: the
    rank's stderr never reached the user. It prints the traceback `@record` left in the error file."""
    error_file = tmp_path / "error.json"
    stack = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: abc\n'
    message = {"message": "ValueError: abc", "extraInfo": {"py_callstack": stack, "timestamp": "0"}}
    error_file.write_text(json.dumps({"message": message}))
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(error_file))
    lines, code = explain_failures({0: failure}, {}, 2)
    assert code == 1
    assert lines == [
        *stack.splitlines(),
        "error: rank 0 exited with code 1 (its traceback is above); stopped ranks [1]",
    ]
