"""The cases of `tools/fuzz_inputs.py`: a small valid input of each target, its mutations, and the
facetrain reader a user's command would give it to. Case N of a target is drawn from its own
`random.Random`, so it can be written again (`--replay`)."""

from __future__ import annotations

import random
from pathlib import Path

from tools.fuzz_features import READER_MODULES as FEATURE_MODULES
from tools.fuzz_features import TARGETS as FEATURE_TARGETS

TOKENS = [
    b"*a", b"&a [*a, *a]", b"[" * 80, b"{a: " * 70, b"1e309", b"-1e309", b"nan", b".inf", b"99999999999999999999",
    b"-5", b"0", b"\x00", b"\xc2\xb2", b"\xff\xfe", b"../", b"../../secret.txt", b"/etc/passwd", b"secret.txt",
    b"!!python/object/apply:os.system ['true']", b"\n", b",", b" ", b"\t", b"'", b'"', b"-", b"1" * 5001,
]  # fmt: skip
INTERESTING_INTS = [0, 1, -1, 2, 255, 256, 65535, 1 << 31, (1 << 32) + 1, 1 << 40, 1 << 62, -(1 << 63)]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """1 to 4 of: flip a bit, set a byte, insert random bytes or a token, delete, duplicate, truncate."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        where = rng.randrange(len(data) + 1)
        if kind == 0 and data:
            data[min(where, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:
            data[min(where, len(data) - 1)] = rng.choice([0, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif kind == 2:
            data[where:where] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 3:
            data[where:where] = rng.choice(TOKENS)
        elif kind == 4:
            del data[where : where + rng.randint(1, 16)]
        elif kind == 5 and data:
            start = rng.randrange(len(data))
            data[where:where] = data[start : start + rng.randint(1, 64)]
        else:
            del data[where:]
    return bytes(data)


def _onnx_model():
    from onnx import TensorProto, helper

    def weight(name: str, dims: list[int]) -> TensorProto:
        count = 1
        for side in dims:
            count *= side
        return helper.make_tensor(name, TensorProto.FLOAT, dims, [0.5] * count)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["n1"], name="bn1", epsilon=1e-5),
        helper.make_node("PRelu", ["n1", "p"], ["r1"], name="prelu"),
        helper.make_node("Identity", ["r1"], ["i1"], name="id"),
        helper.make_node("Conv", ["i1", "w2"], ["c2"], name="conv2", group=1),
        helper.make_node("Add", ["c2", "r1"], ["a1"], name="add"),
        helper.make_node("Flatten", ["a1"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], name="fc", transB=1),
        helper.make_node("Constant", [], ["k"], name="const", value=weight("kv", [2])),
    ]
    initializers = [weight("w1", [2, 3, 1, 1]), weight("w2", [2, 2, 1, 1]), weight("fc", [4, 8]),
                    weight("fb", [4]), weight("p", [2])] + [weight(n, [2]) for n in "sbmv"]  # fmt: skip
    graph = helper.make_graph(
        nodes,
        "seed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=initializers,
    )
    return helper.make_model(graph)


def mutate_onnx(rng: random.Random) -> bytes:
    """Structured mutations of the seed graph, then sometimes of its bytes."""
    from onnx import TensorProto

    model = _onnx_model()
    graph = model.graph
    tensors = list(graph.initializer) + [a.t for n in graph.node for a in n.attribute if a.HasField("t")]
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(8)
        tensor = rng.choice(tensors)
        node = rng.choice(graph.node)
        if kind == 0 and tensor.dims:
            tensor.dims[rng.randrange(len(tensor.dims))] = rng.choice(INTERESTING_INTS)
        elif kind == 1:
            tensor.data_type = rng.choice([0, 2, 7, 8, 9, 11, 14, 16, 99])
        elif kind == 2:
            tensor.raw_data = bytes(rng.randrange(0, 40))
            del tensor.float_data[:]
        elif kind == 3:
            tensor.data_location = TensorProto.EXTERNAL
            del tensor.external_data[:]
            location = rng.choice(
                ["secret.txt", "../secret.txt", "/etc/passwd", "missing.bin", "x/../../secret.txt"]
            )
            tensor.external_data.add(key="location", value=location)
        elif kind == 4 and node.input:  # rewire: loops, dangling names, self-references
            node.input[rng.randrange(len(node.input))] = rng.choice(
                [o for n in graph.node for o in n.output] + ["nowhere"]
            )
        elif kind == 5 and node.attribute:
            attribute = rng.choice(node.attribute)
            attribute.f, attribute.i = (
                rng.choice([float("nan"), float("inf"), -1.0, 1e30]),
                rng.choice(INTERESTING_INTS),
            )
        elif kind == 6:
            del node.input[rng.randrange(len(node.input) + 1) :]
        else:
            del node.output[rng.randrange(len(node.output) + 1) :]
    data = model.SerializeToString()
    return mutate_bytes(data, rng) if rng.random() < 0.2 else data


def _dlib_int(value: int) -> bytes:
    size = (abs(value).bit_length() + 7) // 8
    return bytes([size | (0x80 if value < 0 else 0)]) + abs(value).to_bytes(size, "little")


def _dlib_seed() -> bytes:
    """The head of a dlib metric network through its first fc_ layer (the reader's whole grammar)."""

    def text(value: str) -> bytes:
        return _dlib_int(len(value)) + value.encode()

    def floating(mantissa: int, exponent: int = 0) -> bytes:
        return _dlib_int(mantissa) + _dlib_int(exponent)

    tensor = _dlib_int(2) + b"".join(_dlib_int(side) for side in (1, 1, 1, 6)) + bytes(24)
    alias = _dlib_int(1) + _dlib_int(1) * 4
    fc = _dlib_int(2) + _dlib_int(3) + tensor + alias * 2 + _dlib_int(1) + floating(1) * 4
    return (
        _dlib_int(1) + text("loss_metric_2") + floating(1) * 2 + _dlib_int(2) + text("input_rgb_image_sized")
        + floating(1) * 3 + _dlib_int(150) * 2 + text("fc_2") + fc + b"0" * 3 + tensor * 3
    )  # fmt: skip


def _pth_seed() -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(
        {"conv_sep.layers.0.weight": torch.ones(4, 2, 1, 1), "features.layers.2.weight": torch.ones(4, 8)},
        buffer,
    )
    return buffer.getvalue()


def mutate_pth(rng: random.Random) -> bytes:
    """Byte mutations, or the archive's entries rewritten deflated with one grown (a zip bomb's shape)."""
    import io
    import zipfile

    data = _pth_seed()
    if rng.random() < 0.5:
        return mutate_bytes(data, rng)
    out = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as source,
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target,
    ):
        for entry in source.infolist():
            content = source.read(entry)
            if entry.filename.endswith("/data/0") and rng.random() < 0.5:
                content = bytes(rng.choice([1 << 20, 16 << 20]))
            target.writestr(entry.filename, content)
    return out.getvalue()


def _png(seed: int = 0) -> bytes:
    import cv2
    import numpy as np

    pixels = np.random.default_rng(seed).integers(0, 256, (12, 12, 3), dtype=np.uint8)
    return cv2.imencode(".png", pixels)[1].tobytes()


TEXT_SEEDS = {
    "yaml": b"model:\n  backbone: small\n  embedding_size: 16\ntrain:\n  steps: 3\n  batch_size: 8\nhead:\n  margin_params: {m: 0.2}\n",
    "lfw_pairs": b"2 1\nAbel 1 2\nBob 1 Carl 2\nDan 1 3\nEve 1 Fay 4\n",
    "csv_pairs": b"path1,path2,same,fold\na.png,b.png,1,0\na.png,c.png,0,1\n",
    "list": b"path,label\nann/0.png,0\nann/1.png,0\nbob/0.png,1\n",
    "ijb_faces": b"1.jpg 1 0\n2.jpg 2 1\n",
    "ijb_points": b"1.jpg 38.3 51.7 73.5 51.5 56.0 71.7 41.5 92.4 70.7 92.2 0.9\n2.jpg 38.3 51.7 73.5 51.5 56.0 71.7 41.5 92.4 70.7 92.2 0.9\n",
    "ijb_pairs": b"1 1 1\n1 2 0\n",
    "meta": b'{"step": 2, "epoch": 0, "consumed": 16, "world_size": 1, "num_classes": 2, "embedding_size": 16}',
    "pointer": b"step_00000002",
}  # fmt: skip


def write_case(target: str, rng: random.Random, folder: Path) -> Path:
    """Write the case's input under `folder` and return what the reader is given."""
    if target in FEATURE_TARGETS:
        return FEATURE_TARGETS[target][0](rng, folder)
    if target == "onnx":
        return write_file(folder / "model.onnx", mutate_onnx(rng))
    if target == "dlib":
        return write_file(folder / "model.dat", mutate_bytes(_dlib_seed(), rng))
    if target == "pth":
        return write_file(folder / "backbone.pth", mutate_pth(rng))
    if target == "image":
        return write_file(folder / "face.png", mutate_bytes(_png(), rng))
    if target == "bin":
        import pickle

        seed = pickle.dumps(([_png(0), _png(1), _png(2), _png(3)], [True, False]), protocol=2)
        return write_file(folder / "lfw.bin", mutate_bytes(seed, rng))
    if target == "rec":
        from facetrain.data.recordio import write_recordio

        images = folder / "images"
        for index in range(4):
            write_file(images / f"id{index % 2}" / f"{index}.png", _png(index))
        rec, idx = write_recordio(images, folder / "train", progress=False)
        victim = rng.choice([rec, idx])
        victim.write_bytes(mutate_bytes(victim.read_bytes(), rng))
        return rec
    if target == "checkpoint":
        checkpoint = folder / "run" / "checkpoints" / "step_00000002"
        files = {
            "meta.json": TEXT_SEEDS["meta"],
            "classes.json": b'["a", "b"]',
            "config.yaml": TEXT_SEEDS["yaml"],
        }
        for name, content in files.items():
            write_file(checkpoint / name, content)
        write_file(checkpoint / ".metadata", b"")
        write_file(folder / "run" / "checkpoints" / "last", TEXT_SEEDS["pointer"])
        victim = rng.choice([*(checkpoint / name for name in files), folder / "run" / "checkpoints" / "last"])
        victim.write_bytes(mutate_bytes(victim.read_bytes(), rng))
        return folder / "run"
    if target == "ijb":
        names = {"ijb_faces": "ijbc_face_tid_mid.txt", "ijb_points": "ijbc_name_5pts_score.txt",
                 "ijb_pairs": "ijbc_template_pair_label.txt"}  # fmt: skip
        victim = rng.choice(list(names))
        for key, name in names.items():
            content = TEXT_SEEDS[key]
            write_file(
                folder / "IJBC" / "meta" / name, mutate_bytes(content, rng) if key == victim else content
            )
        for name in ("1.jpg", "2.jpg"):
            write_file(folder / "IJBC" / "loose_crop" / name, _png())
        return folder / "IJBC"
    images = {"lfw_pairs": ["Abel/Abel_0001", "Abel/Abel_0002", "Bob/Bob_0001", "Carl/Carl_0002", "Dan/Dan_0001",
                            "Dan/Dan_0003", "Eve/Eve_0001", "Fay/Fay_0004"],
              "csv_pairs": ["a", "b", "c"], "list": ["ann/0", "ann/1", "bob/0"]}  # fmt: skip
    for index, name in enumerate(images.get(target, [])):
        write_file(folder / f"{name}.png", _png(index))
    suffix = {"yaml": "yaml", "lfw_pairs": "txt", "csv_pairs": "csv", "list": "csv"}[target]
    return write_file(folder / f"input.{suffix}", mutate_bytes(TEXT_SEEDS[target], rng))


def write_file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def read_case(target: str, path: Path, out: Path) -> None:
    """Give the input to the reader a user's command would: every importer and parser under test."""
    if target in FEATURE_TARGETS:
        FEATURE_TARGETS[target][1](path, out)
        return
    if target == "onnx":
        from facetrain.interop.insightface_onnx import read_iresnet_onnx

        read_iresnet_onnx(path)
    elif target == "dlib":
        from facetrain.interop.dlib_format import read_dlib_network

        read_dlib_network(path)
    elif target == "pth":
        from facetrain.interop.insightface_import import infer_architecture, read_backbone_state

        infer_architecture(read_backbone_state(path), path)
    elif target == "image":
        from facetrain.data.decode import decode_image, image_file_problem

        image_file_problem(path)
        decode_image(path)
    elif target == "bin":
        from facetrain.eval.insightface_bin import load_insightface_bin

        load_insightface_bin(path, None, False)
    elif target == "rec":
        from facetrain.data.recordio import scan_recordio

        table = scan_recordio(path, progress=False)
        for index in range(min(len(table.labels), 4)):
            table.reader.read(index)
    elif target == "checkpoint":
        from facetrain.checkpoint import find_resume_point
        from facetrain.checkpoint.layout import read_meta
        from facetrain.train.run_config import checkpoint_config

        checkpoint = path / "checkpoints" / "step_00000002"
        _each(
            lambda: find_resume_point(path),
            lambda: read_meta(checkpoint),
            lambda: checkpoint_config(checkpoint),
        )
    elif target == "ijb":
        from facetrain.eval.ijb_meta import read_ijb_meta

        read_ijb_meta(path)
    elif target == "yaml":
        from facetrain.train.run_checks import validate
        from facetrain.train.run_config import load_config

        validate(load_config(path), 1)
    elif target == "lfw_pairs":
        from facetrain.eval.lfw_pairs import load_lfw_pairs

        load_lfw_pairs(path, None, True)
    elif target == "csv_pairs":
        from facetrain.eval.csv_pairs import load_csv_pairs

        load_csv_pairs(path, None, True)
    elif target == "list":
        from facetrain.data.listfile import scan_list_file

        scan_list_file(path)
    else:
        raise ValueError(target)


def _each(*calls) -> None:
    """Run every call; a FacetrainError ends only its own call, so each reader is exercised."""
    from facetrain.errors import FacetrainError

    for call in calls:
        try:
            call()
        except FacetrainError as error:
            check_message(error)


def check_message(error: Exception) -> None:
    text = str(error)
    if "\n" in text or len(text) > 1000 or not text:
        raise AssertionError(f"a message of {text.count(chr(10)) + 1} lines and {len(text)} characters")


READER_MODULES = (
    "facetrain.checkpoint", "facetrain.config", "facetrain.data.decode", "facetrain.data.listfile",
    "facetrain.data.recordio", "facetrain.eval.csv_pairs", "facetrain.eval.ijb_meta", "facetrain.eval.insightface_bin",
    "facetrain.eval.lfw_pairs", "facetrain.interop.dlib_format", "facetrain.interop.insightface_import",
    "facetrain.interop.insightface_onnx", "facetrain.train.run_checks", "onnx",
)  # fmt: skip


def import_readers() -> None:
    """Import every reader before the first case, so no case's time limit pays for importing torch
    (seconds, more on a loaded machine)."""
    import importlib

    for name in READER_MODULES + FEATURE_MODULES:
        importlib.import_module(name)


TARGETS = (
    "onnx",
    "dlib",
    "pth",
    "image",
    "bin",
    "rec",
    "checkpoint",
    "ijb",
    "yaml",
    "lfw_pairs",
    "csv_pairs",
    "list",
    *FEATURE_TARGETS,
)
