"""A full disk (#38, medium): export, import and the eval report say so in one line naming the file
they were writing, and leave no temporary file, where export aborted the process from C++ (exit 134,
`terminate called after throwing c10::Error`) and the others were OSError tracebacks. The real full
disk is a 64 KiB tmpfs where this machine lets the tests mount one; the rest simulate ENOSPC."""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from facetrain.checkpoint.names import BACKBONE
from facetrain.cli.user_errors import environment_error_line
from facetrain.eval.set_names import report_file_name
from facetrain.files import write_failure_advice
from facetrain.interop.insightface_import import write_imported_checkpoint
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from tests.support.fault_helpers import error_lines
from tests.support.hostile_helpers import one_line_error
from tests.support.small_models import EMBEDDING_SIZE, fresh_backbone, small_config
from tests.support.train_helpers import run_cli

FULL = "No space left on device; free space, then run it again"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    config = small_config()
    entries = {BACKBONE + key: value for key, value in fresh_backbone(config).state_dict().items()}
    path = tmp_path / "checkpoint"
    write_imported_checkpoint(entries, {"embedding_size": EMBEDDING_SIZE}, config, [], path)
    return path


@pytest.fixture
def full_disk(tmp_path: Path):
    """A mounted 64 KiB tmpfs, filled up; skipped where mounting is not allowed (not root, a sandbox)."""
    mount = tmp_path / "full"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        descriptor = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        with pytest.raises(OSError):
            while True:
                os.write(descriptor, bytes(4096))
        os.close(descriptor)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def temporary_files(folder: Path) -> list[str]:
    return [path.name for path in folder.rglob(".*") if ".tmp-" in path.name]


@pytest.mark.parametrize("formats", ["torchscript", "safetensors", "onnx"])
def test_export_to_a_full_disk_is_one_line_and_leaves_nothing(checkpoint, full_disk, formats) -> None:
    out = full_disk / "export"
    result = run_cli("export", str(checkpoint), "-o", str(out), "--formats", formats, "--quiet", timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    name = {"torchscript": "model.torchscript.pt", "safetensors": "model.safetensors", "onnx": "model.onnx"}[
        formats
    ]
    assert error_lines(result.stderr) == [f"error: {out / name}: {FULL}"]
    assert temporary_files(full_disk) == [] and list(out.iterdir()) == []


def test_export_safetensors_on_enospc_is_one_line(checkpoint, tmp_path, monkeypatch) -> None:
    """Simulated: safetensors reports the failed write as a SafetensorError carrying the OS error."""
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr("facetrain.interop.safetensors_format.save_safetensors_model", full)
    out = tmp_path / "export"
    line = one_line_error("export", checkpoint, "-o", out, "--formats", "safetensors", "--quiet")
    assert line == f"error: {out / 'model.safetensors'}: {FULL}"
    assert temporary_files(tmp_path) == []


def test_import_on_enospc_names_the_output_and_leaves_no_temporary_folder(tmp_path, monkeypatch) -> None:
    source = tmp_path / "backbone.pth"
    torch.save(build_backbone(ModelConfig(backbone="mbf", embedding_size=8), (112, 112)).state_dict(), source)

    def full(entries, folder, *args, **kwargs):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__0_0.distcp").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr("facetrain.interop.insightface_import.save_entries", full)
    out = tmp_path / "imported"
    assert one_line_error("import", "insightface", source, "-o", out, "--quiet") == f"error: {out}: {FULL}"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["backbone.pth"]


def test_the_eval_report_on_enospc_is_one_line(checkpoint, tmp_path, monkeypatch) -> None:
    for identity in ("ann", "bob"):
        (tmp_path / "faces" / identity).mkdir(parents=True)
        for index in range(3):
            image = np.random.default_rng(index).integers(0, 256, (32, 32, 3), dtype=np.uint8)
            cv2.imwrite(str(tmp_path / "faces" / identity / f"{index}.png"), image)
    write_bytes = pathlib.Path.write_bytes

    def full_for_temporary_files(self, data):
        if ".tmp-" in self.name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_bytes(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", full_for_temporary_files)
    out = tmp_path / "report"
    line = one_line_error(
        "eval", checkpoint, "--folder", tmp_path / "faces", "-o", out, "--device", "cpu", "-q"
    )
    assert line == f"error: {out / report_file_name(tmp_path / 'faces')}.json: {FULL}"
    assert temporary_files(tmp_path) == []


def test_the_command_line_and_the_trainer_give_one_advice_for_each_failed_write() -> None:
    """One table (`files.WRITE_FAILURE_ADVICE`) for the command line's line and the trainer's and the
    checkpoint writer's advice: they had one each, and a quota, a file too big for the file system or a
    read-only file system got different advice from each."""
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EISDIR):
        error = OSError(code, os.strerror(code), "out/model.safetensors")
        advice = write_failure_advice(error)
        line = environment_error_line(error)
        assert line == f"out/model.safetensors: {os.strerror(code)}; {advice}, then run it again"
    assert write_failure_advice(OSError(errno.EDQUOT, "")) == "free space within your quota"
    assert environment_error_line(OSError(errno.ECONNRESET, "")) is None  # not the machine's refusal: a bug
