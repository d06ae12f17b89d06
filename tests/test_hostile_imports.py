"""Hostile files for `facetrain import insightface` and `import dlib` (#38): named pipes and devices
(high item 5), reads and allocations without bound (high item 6), and the dlib medium cases (a shape
that wraps int64, a float exponent out of range, a reshape before the size check). Each is one line
with nothing written."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import torch

from facetrain.interop.dlib_format import MAX_FILE_BYTES
from tests.support.hostile_helpers import one_line_error


def dlib_int(value: int) -> bytes:
    """dlib's serialize.h integer: a control byte (byte count, 0x80 when negative), then the bytes."""
    size = (abs(value).bit_length() + 7) // 8
    return bytes([size | (0x80 if value < 0 else 0)]) + abs(value).to_bytes(size, "little")


def dlib_str(text: str) -> bytes:
    return dlib_int(len(text)) + text.encode()


def dlib_float(mantissa: int, exponent: int = 0) -> bytes:
    return dlib_int(mantissa) + dlib_int(exponent)


def dlib_file(path: Path, margin: bytes = dlib_float(1), fc: bytes = b"") -> Path:
    """The start of a dlib metric-loss network whose first layer is an fc_ with the bytes `fc`."""
    head = dlib_int(1) + dlib_str("loss_metric_2") + margin + dlib_float(1)
    input_layer = dlib_int(2) + dlib_str("input_rgb_image_sized") + dlib_float(1) * 3 + dlib_int(150) * 2
    path.write_bytes(head + input_layer + dlib_str("fc_2") + fc)
    return path


def fc_tensor(outputs: int, inputs: int, shape: tuple[int, ...], values: int) -> bytes:
    tensor = dlib_int(2) + b"".join(dlib_int(side) for side in shape) + b"\0\0\0\0" * values
    alias = dlib_int(1) + dlib_int(1) * 4
    return dlib_int(outputs) + dlib_int(inputs) + tensor + alias * 2 + dlib_int(0) + dlib_float(1) * 4


def import_error(kind: str, source: Path, out: Path) -> str:
    line = one_line_error("import", kind, source, "-o", out, "--quiet")
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.tmp-*"))
    return line


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind, name", [("insightface", "fifo.pth"), ("dlib", "fifo.dat")])
def test_a_named_pipe_is_one_line_not_a_hang(tmp_path: Path, kind: str, name: str) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    what = "model" if kind == "insightface" else "dlib model"
    line = import_error(kind, fifo, tmp_path / "out")
    assert line == f"error: {what} {fifo} is a named pipe, not a file; pass the file itself"


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["insightface", "dlib"])
def test_dev_zero_is_refused_before_a_byte_is_read(tmp_path: Path, kind: str) -> None:
    """Before, `import dlib /dev/zero` read until memory ran out."""
    line = import_error(kind, Path("/dev/zero"), tmp_path / "out")
    assert line.endswith("/dev/zero is a character device, not a file; pass the file itself")


def test_a_dlib_file_larger_than_any_network_is_not_read(tmp_path: Path) -> None:
    huge = dlib_file(tmp_path / "huge.dat")
    os.truncate(huge, MAX_FILE_BYTES + 1)  # sparse: no disk and no time
    line = import_error("dlib", huge, tmp_path / "out")
    assert line == (
        f"error: dlib model {huge} holds {MAX_FILE_BYTES + 1} bytes, more than the {MAX_FILE_BYTES} a "
        "dlib model can need; check that it is the right file"
    )


@pytest.mark.parametrize(
    "margin, fc, problem",
    [
        (dlib_float(1, 1 << 40), b"", "a float of exponent 1099511627776 is out of range"),
        (
            dlib_float(1),
            fc_tensor(3, 5, (1 << 32, 1 << 32, 1, 1), 0),
            "tensor shape (4294967296, 4294967296, 1, 1) holds more values than the file has bytes left",
        ),
        (dlib_float(1), fc_tensor(3, 5, (1, 1, 1, 4), 4), "fc_ 5 -> 3 holds 4 parameters, not 18"),
    ],
    ids=["huge exponent", "shape wrapping int64", "fc smaller than its shape"],
)
def test_dlib_values_out_of_range_are_one_line(
    tmp_path: Path, margin: bytes, fc: bytes, problem: str
) -> None:
    """Before: OverflowError, a reshape ValueError of the wrapped count, a reshape before the size check."""
    model = dlib_file(tmp_path / "bad.dat", margin, fc)
    line = import_error("dlib", model, tmp_path / "out")
    assert line.startswith(f"error: {model}: byte ") and f": {problem}; this is not a dlib DNN file" in line


def test_a_pth_declaring_a_tensor_far_larger_than_itself_is_refused(tmp_path: Path) -> None:
    """A deflated 64 MiB tensor in a 64 KiB file: before, torch inflated all of it before the key check
    (1 GiB in a 1 MB file the same way)."""
    stored = tmp_path / "stored.pth"
    torch.save({"fc.weight": torch.zeros(16 << 20)}, stored)
    bomb = tmp_path / "bomb.pth"
    with zipfile.ZipFile(stored) as source, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as target:
        for entry in source.infolist():
            target.writestr(entry.filename, source.read(entry), compress_type=zipfile.ZIP_DEFLATED)
    stored.unlink()
    assert bomb.stat().st_size < 1 << 20
    line = import_error("insightface", bomb, tmp_path / "out")
    assert line.startswith(f"error: {bomb}: entry 'stored/data/0' inflates from ")
    assert line.endswith(
        f"to {64 << 20} bytes; torch.save never compresses, so the file was made to exhaust memory or "
        "damaged; save `model.state_dict()` with torch.save and import that"
    )


def test_a_small_file_under_a_huge_limit_is_read_without_allocating_the_limit(tmp_path: Path) -> None:
    """read(limit + 1) allocates its argument up front: a 4 GiB limit for a .bin took 4 GiB per read
    (a MemoryError in the fuzzer's 6 GB worker); the file's own size is asked for instead."""
    from facetrain.input_files import read_regular_bytes

    path = tmp_path / "small.bin"
    path.write_bytes(b"twelve bytes")
    assert read_regular_bytes(path, "file", 1 << 45) == b"twelve bytes"
