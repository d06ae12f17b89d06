"""A file size limit (`ulimit -f`, RLIMIT_FSIZE) met by a checkpoint and an export (#57, environment):
one line that names the limit, not "free space" (the disk had plenty), and the previous good output
intact. Before, the checkpoint's line read "writing failed ([enforce fail at inline_container.cc:672]
. unexpected pos ...)" with free-space advice, and the export's "the file system cannot hold a file
this big". Real processes started with the limit."""

from __future__ import annotations

import hashlib
import resource
import shutil
import subprocess
import sys
from pathlib import Path

from facetrain.checkpoint import find_resume_point
from facetrain.checkpoint.layout import find_damage
from tests.support.fault_helpers import ENV, error_lines
from tests.support.hostile_helpers import one_line_error
from tests.support.train_helpers import REPO, run_cli

LIMIT = 1 << 20  # bytes: the small model's checkpoint is 4.5 MB


def limited(*args: str) -> subprocess.CompletedProcess:
    """`facetrain ARGS` in a process whose files may not grow past LIMIT."""
    return subprocess.run(
        [sys.executable, "-m", "facetrain", *args],
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT)),
        capture_output=True, text=True, cwd=REPO, env=ENV, timeout=300,
    )  # fmt: skip


def digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


def test_a_file_size_limit_during_a_checkpoint_and_an_export_is_one_line_keeping_the_last_good_output(
    finished_run, tmp_path
):
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    config = tmp_path / "run.yaml"
    config.write_text(config.read_text().replace(str(finished_run), str(tmp_path)))
    checkpoints = tmp_path / "run" / "checkpoints"
    result = limited("train", "-c", str(config), "--resume", "auto", "--set", "train.steps=3")
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr)[-1] == (
        f"error: cannot write checkpoint {checkpoints / 'step_00000003'}: File too large "
        f"({checkpoints / 'step_00000003.tmp'}); the last complete one, step_00000002, is intact. Raise the "
        f"process's file size limit (ulimit -f, {LIMIT} bytes), then resume with --resume auto"
    )
    assert sorted(p.name for p in checkpoints.iterdir()) == ["last", "step_00000002"]
    assert find_resume_point(tmp_path / "run")[0].name == "step_00000002"
    assert find_damage(checkpoints / "step_00000002") is None

    export = tmp_path / "export"
    assert (
        run_cli("export", str(tmp_path / "run"), "-o", str(export), "--formats", "safetensors").returncode
        == 0
    )
    before = digest(export)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, hard))  # this process: Python ignores SIGXFSZ
    try:
        line = one_line_error(
            "export", tmp_path / "run", "-o", export, "--formats", "safetensors", "--overwrite", "-q"
        )
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert line == (
        f"error: {export / 'model.safetensors'}: File too large; raise the process's file size limit "
        f"(ulimit -f, {LIMIT} bytes), then run it again"
    )
    assert digest(export) == before
