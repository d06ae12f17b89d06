"""`facetrain pack` against hostile outputs, disks, files and a second pack (#57, round 4): one line each,
no temporary file left, the earlier output as it was."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.data import recordio
from facetrain.data.pack import LOCK_NAME
from facetrain.errors import FacetrainError
from tests.support.hostile_helpers import one_line_error
from tests.support.pack_folders import write_noise_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return write_noise_folder(tmp_path / "faces")


EARLIER = {"train.rec": b"earlier rec", "train.idx": b"0\t0\n", "property": b"3,12,10\n"}


def earlier_pack(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name, data in EARLIER.items():
        (out / name).write_bytes(data)
    return out / "train.rec"


def left_as_it_was(out: Path) -> bool:
    """The earlier three files unchanged and nothing beside them (no temporary file, no lock)."""
    names = {path.name for path in out.iterdir()}
    return names == set(EARLIER) and all((out / n).read_bytes() == data for n, data in EARLIER.items())


def test_an_output_under_a_file_is_one_line(folder, tmp_path):
    """Was a FileExistsError traceback from mkdir."""
    (tmp_path / "afile").write_text("x")
    line = one_line_error("pack", folder, "-o", tmp_path / "afile" / "train.rec", "-q")
    assert line == f"error: -o {tmp_path / 'afile'} is a file, not a folder; choose another -o"


@pytest.mark.parametrize("name", ["train.idx", "property", "train.rec"])
def test_a_folder_where_an_output_file_belongs_is_one_line_before_any_work(folder, tmp_path, name):
    """Was an IsADirectoryError traceback at the final rename, the .rec already replaced and the .idx's
    temporary file left (train.idx), or `already exists` advice that --overwrite could not follow."""
    out = tmp_path / "packed"
    earlier_pack(out)
    (out / name).unlink()
    (out / name).mkdir()
    line = one_line_error("pack", folder, "-o", out / "train.rec", "-q", "--overwrite")
    assert (
        line
        == f"error: -o: {out / name} is a folder, where a file of that name is written; move it or choose another -o"
    )
    assert sorted(path.name for path in out.iterdir()) == sorted(
        EARLIER
    )  # nothing written, not even the lock


def test_a_file_size_limit_is_named_as_such_and_leaves_nothing(folder, tmp_path):
    """`ulimit -f` (RLIMIT_FSIZE) in the pack's process: was `error: File too large; the file system
    cannot hold a file this big` naming no file, and its temporary .rec was left."""
    out = tmp_path / "packed"
    earlier_pack(out)
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))
        from facetrain.cli import main
        sys.argv = ["facetrain", "pack", {str(folder)!r}, "-o", {str(out / "train.rec")!r}, "-q", "--overwrite"]
        main()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and lines == [
        f"error: {out / 'train.rec'}: File too large; raise the process's file size limit (ulimit -f, 600 "
        "bytes), then run it again"
    ], result.stderr[-2000:]
    assert left_as_it_was(out)


def test_a_full_disk_advises_free_space_and_leaves_the_earlier_pack(folder, tmp_path, monkeypatch):
    """ENOSPC met by a write() (no file named): was a line naming no file, the temporary .rec left."""
    out = tmp_path / "packed"
    earlier_pack(out)
    calls = []

    def full(self, continuation, part):
        calls.append(part)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(recordio.RecordIOWriter, "_write_part", full)
    line = one_line_error("pack", folder, "-o", out / "train.rec", "-q", "--overwrite")
    assert line == f"error: {out / 'train.rec'}: No space left on device; free space, then run it again"
    assert left_as_it_was(out)


def test_a_huge_file_is_refused_by_its_size_and_header_before_it_is_read(folder, tmp_path, monkeypatch):
    """A sparse 700 MB file named .png was read whole (24 s, 1.7 GB) before it was refused; one of
    20 MB was too. Now its size (past what a record holds) or its header refuses it unread."""
    from facetrain.data import dataset

    read = []
    monkeypatch.setattr(dataset, "read_file_bytes", lambda path: read.append(path) or Path(path).read_bytes())
    huge, zeros = folder / "bob" / "huge.png", folder / "carol" / "zeros.png"
    with huge.open("wb") as handle:
        handle.truncate(recordio.MAX_RECORD_BYTES + 1)
    line = one_line_error("pack", folder, "-o", tmp_path / "a" / "train.rec", "-q")
    assert line == (
        f"error: image {huge} holds {recordio.MAX_RECORD_BYTES + 1} bytes, more than a RecordIO record can "
        f"({recordio.MAX_RECORD_BYTES}); check that it is an image, or leave it out"
    )
    huge.unlink()
    with zeros.open("wb") as handle:
        handle.truncate(20 << 20)
    line = one_line_error("pack", folder, "-o", tmp_path / "b" / "train.rec", "-q")
    assert line == f"error: image {zeros} is corrupt or not an image"
    assert huge not in read and zeros not in read


def test_a_second_pack_into_the_folder_is_refused_naming_the_first(folder, tmp_path):
    """Two packs to one output both reported success (no lock), the later rename winning. A pack killed
    while it holds the lock leaves its lock file, which the next pack takes and removes."""
    out = tmp_path / "packed"
    out.mkdir()
    hold = (
        "import time; from pathlib import Path; from facetrain.output_lock import output_lock\n"  # no torch: fast
        f"with output_lock(Path({str(out)!r}), {LOCK_NAME!r}, 'facetrain pack', ''):\n"
        "    print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        line = one_line_error("pack", folder, "-o", out / "train.rec", "-q")
        assert line.startswith(f"error: {out} is in use by facetrain pack (PID {holder.pid} on host ")
        assert line.endswith("; wait for it to finish, or pack into another folder")
        assert [path.name for path in out.iterdir()] == [".facetrain-pack.lock"]
    finally:
        holder.kill()
        holder.wait()
    result = CliRunner().invoke(main, ["pack", str(folder), "-o", str(out / "train.rec"), "-q"])
    assert result.exit_code == 0, result.output
    assert sorted(path.name for path in out.iterdir()) == ["property", "train.idx", "train.rec"]


@pytest.mark.parametrize("name", ["train.idx", "property"])
def test_a_huge_index_or_property_is_refused_by_its_size_before_it_is_read(
    folder, tmp_path, monkeypatch, name
):
    """A sparse .idx or property of 2 GB was read whole (27-31 s, 4.9 GB) before it was refused; now
    its size, against what the .rec can index (or a property line can need), refuses it unread."""
    from facetrain.data.recordio import scan_recordio

    out = tmp_path / "packed"
    assert CliRunner().invoke(main, ["pack", str(folder), "-o", str(out / "train.rec"), "-q"]).exit_code == 0
    with (out / name).open("r+b") as handle:
        handle.truncate(2 << 30)
    from facetrain import input_files

    small_only = input_files._read_up_to
    monkeypatch.setattr(
        input_files,
        "_read_up_to",
        lambda h, size, limit: small_only(h, size, limit) if size < 1 << 20 else pytest.fail("read"),
    )
    with pytest.raises(
        FacetrainError,
        match=rf"^(RecordIO index|property file) {out / name} holds 2147483648 bytes, more than the \d+ ",
    ):
        scan_recordio(out / "train.rec", progress=False)
