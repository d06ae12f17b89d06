"""Files a hostile or unlucky user hands facetrain, made on the spot for the bad-input sweep and tests.

Each writer returns the path it wrote. The decompression bomb is the issue's: a 30000x30000 one-bit
PNG of about 110 KB whose decode would take 2.7 GB.
"""

from __future__ import annotations

import os
import pickle
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def huge_png(path: Path, side: int = 30000) -> Path:
    """A side x side one-bit black PNG, compressed to almost nothing."""
    row = b"\0" * (1 + (side + 7) // 8)
    compressor = zlib.compressobj(9)
    body = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", body)
        + _png_chunk(b"IEND", b"")
    )
    return path


def noise_png(path: Path, size: int = 40, seed: int = 0) -> Path:
    """A small valid RGB PNG of noise (no face in it)."""
    import cv2

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    cv2.imwrite(str(path), pixels)
    return path


def cut_png(path: Path) -> Path:
    """A valid PNG with its second half missing, as a broken download leaves it."""
    whole = noise_png(path).read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return path


def text_named_like_an_image(path: Path) -> Path:
    path.write_text("these are my notes, not a photo\n")
    return path


def empty_file(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def plain_pickle(path: Path) -> Path:
    """A pickle that is not a weights-only torch file (harmless: a dict of ints)."""
    path.write_bytes(pickle.dumps({"conv1.weight": [1, 2, 3]}))
    return path


def tiff_bomb(path: Path, side: int = 20000) -> Path:
    """Issue 38's TIFF decompression bomb: one 1-bit PackBits strip announcing side x side pixels."""
    entries = [(256, 4, side), (257, 4, side), (258, 3, 1), (259, 3, 32773), (262, 3, 1),
               (273, 4, 8 + 2 + 12 * 9 + 4), (277, 3, 1), (278, 4, side), (279, 4, 2)]  # fmt: skip
    ifd = struct.pack("<H", len(entries)) + b"".join(
        struct.pack("<HHII", tag, kind, 1, value) for tag, kind, value in entries
    )
    path.write_bytes(b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + b"\x81\x00")
    return path


def alias_bomb_yaml(path: Path, levels: int = 6) -> Path:
    """A few hundred bytes of nested YAML aliases that safe_load would expand to 9**levels strings."""
    anchors = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    anchors += [f"&a{level} [{', '.join([f'*a{level - 1}'] * 9)}]" for level in range(1, levels + 1)]
    path.write_text("train:\n  steps: [" + ", ".join(anchors) + "]\n")
    return path


def latin1_yaml(path: Path) -> Path:
    path.write_bytes("# café\ntrain: {steps: 2}\n".encode("latin-1"))
    return path


def named_pipe(path: Path) -> Path:
    """A FIFO: opening it for reading waits for a writer, which never comes."""
    os.mkfifo(path)
    return path


def dangling_symlink(path: Path) -> Path:
    os.symlink(path.parent / "nowhere" / path.name, path)
    return path


def external_data_onnx(path: Path) -> Path:
    """An ONNX model whose Constant node stores its value in `secret.txt`, beside it or in the
    current folder as onnx would resolve it (issue 38: it was read into the import)."""
    from onnx import TensorProto, helper

    value = TensorProto(name="c", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    value.external_data.add(key="location", value="secret.txt")
    nodes = [
        helper.make_node("Constant", [], ["slope"], value=value),
        helper.make_node("PRelu", ["x", "slope"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    import onnx

    onnx.save(helper.make_model(graph), str(path))
    (path.parent / "secret.txt").write_bytes(b"TOPSECRET-0123456789abcdef")
    return path


def wrapping_dlib(path: Path) -> Path:
    """A dlib network head whose first tensor's shape, 2**32 x 2**32, wraps int64 to 0."""

    def integer(value: int) -> bytes:
        size = (abs(value).bit_length() + 7) // 8
        return bytes([size | (0x80 if value < 0 else 0)]) + abs(value).to_bytes(size, "little")

    def text(value: str) -> bytes:
        return integer(len(value)) + value.encode()

    one = integer(1) + integer(0)  # the float 1 * 2**0
    tensor = integer(2) + b"".join(integer(side) for side in (1 << 32, 1 << 32, 1, 1))
    path.write_bytes(
        integer(1) + text("loss_metric_2") + one * 2 + integer(2) + text("input_rgb_image_sized") + one * 3
        + integer(150) * 2 + text("fc_2") + integer(3) + integer(5) + tensor
    )  # fmt: skip
    return path


def evil_torchscript(path: Path, victim: Path) -> Path:
    """A TorchScript module whose forward fills the first 8 bytes of `victim` with 'X' (issue 38)."""
    import torch

    class Overwriter(torch.nn.Module):
        def __init__(self, target: str) -> None:
            super().__init__()
            self.target = target

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            written = torch.from_file(self.target, shared=True, size=8, dtype=torch.uint8).fill_(88)
            return images.flatten(1)[:, :8] + 0 * written.float()

    with warnings.catch_warnings():  # torch's notes that TorchScript is deprecated
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(Overwriter(str(victim))), str(path))
    return path
