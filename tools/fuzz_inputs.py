"""A mutation fuzzer for facetrain's importers and readers: each case is a small valid input, mutated.

    python tools/fuzz_inputs.py --cases 300 --seed 0 --out fuzz.json      # 300 cases per target
    python tools/fuzz_inputs.py --replay onnx:17 --seed 0 --keep case17   # one case again, kept

Targets: ONNX graphs (`import insightface`'s reader; mutated as a graph: shapes, types, raw data,
external data, attributes, wiring that loops), dlib `.dat`, `.pth` (torch.save zips, their entries
recompressed), a run folder's checkpoint files (`--resume auto`'s search), `.bin` verification pickles,
`.rec`/`.idx`, images, and the text readers (YAML configs, LFW and CSV pairs, IJB meta, list files),
mutated byte by byte and with hostile tokens (aliases, `..`, 1e309, 20-digit numbers, NUL, superscripts).

A finding is anything but success or one line of FacetrainError (a traceback's exception, a message
of several lines or over 1000 characters, a line a C library printed to stderr beside it), a case over `--timeout` seconds, the worker's peak memory
growing by more than `--max-memory-mb`, a crash of the worker, or a file opened outside the case's
input folder under the fuzzing folder (planted `secret.txt` files beside and above it) or written
outside its output folder, as an audit hook sees them. The worker's address space is capped at
ADDRESS_SPACE_GB, so an allocation of gigabytes is a MemoryError there rather than the OOM killer's. Cases are reproducible: case N of a target is
drawn from `Random(f"{seed}:{target}:{N}")`.

All cases run in one worker process that imports facetrain once; a crash restarts it at the next case.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOKENS = [
    b"*a", b"&a [*a, *a]", b"[" * 80, b"{a: " * 70, b"1e309", b"-1e309", b"nan", b".inf", b"99999999999999999999",
    b"-5", b"0", b"\x00", b"\xc2\xb2", b"\xff\xfe", b"../", b"../../secret.txt", b"/etc/passwd", b"secret.txt",
    b"!!python/object/apply:os.system ['true']", b"\n", b",", b" ", b"\t", b"'", b'"', b"-", b"1" * 5001,
]  # fmt: skip
ADDRESS_SPACE_GB = 6
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


# ---- seeds: a small valid input of each kind, and the reader it goes to -------------------------


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


def _write_case(target: str, rng: random.Random, folder: Path) -> Path:
    """Write the case's input under `folder` and return what the reader is given."""
    if target == "onnx":
        return _file(folder / "model.onnx", mutate_onnx(rng))
    if target == "dlib":
        return _file(folder / "model.dat", mutate_bytes(_dlib_seed(), rng))
    if target == "pth":
        return _file(folder / "backbone.pth", mutate_pth(rng))
    if target == "image":
        return _file(folder / "face.png", mutate_bytes(_png(), rng))
    if target == "bin":
        import pickle

        seed = pickle.dumps(([_png(0), _png(1), _png(2), _png(3)], [True, False]), protocol=2)
        return _file(folder / "lfw.bin", mutate_bytes(seed, rng))
    if target == "rec":
        from facetrain.data.recordio import write_recordio

        images = folder / "images"
        for index in range(4):
            _file(images / f"id{index % 2}" / f"{index}.png", _png(index))
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
            _file(checkpoint / name, content)
        _file(checkpoint / ".metadata", b"")
        _file(folder / "run" / "checkpoints" / "last", TEXT_SEEDS["pointer"])
        victim = rng.choice([*(checkpoint / name for name in files), folder / "run" / "checkpoints" / "last"])
        victim.write_bytes(mutate_bytes(victim.read_bytes(), rng))
        return folder / "run"
    if target == "ijb":
        names = {"ijb_faces": "ijbc_face_tid_mid.txt", "ijb_points": "ijbc_name_5pts_score.txt",
                 "ijb_pairs": "ijbc_template_pair_label.txt"}  # fmt: skip
        victim = rng.choice(list(names))
        for key, name in names.items():
            content = TEXT_SEEDS[key]
            _file(folder / "IJBC" / "meta" / name, mutate_bytes(content, rng) if key == victim else content)
        for name in ("1.jpg", "2.jpg"):
            _file(folder / "IJBC" / "loose_crop" / name, _png())
        return folder / "IJBC"
    images = {"lfw_pairs": ["Abel/Abel_0001", "Abel/Abel_0002", "Bob/Bob_0001", "Carl/Carl_0002", "Dan/Dan_0001",
                            "Dan/Dan_0003", "Eve/Eve_0001", "Fay/Fay_0004"],
              "csv_pairs": ["a", "b", "c"], "list": ["ann/0", "ann/1", "bob/0"]}  # fmt: skip
    for index, name in enumerate(images.get(target, [])):
        _file(folder / f"{name}.png", _png(index))
    suffix = {"yaml": "yaml", "lfw_pairs": "txt", "csv_pairs": "csv", "list": "csv"}[target]
    return _file(folder / f"input.{suffix}", mutate_bytes(TEXT_SEEDS[target], rng))


def _file(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _read(target: str, path: Path, out: Path) -> None:
    """Give the input to the reader a user's command would: every importer and parser under test."""
    if target == "onnx":
        from facetrain.export.insightface_onnx import read_iresnet_onnx

        read_iresnet_onnx(path)
    elif target == "dlib":
        from facetrain.export.dlib_format import read_dlib_network

        read_dlib_network(path)
    elif target == "pth":
        from facetrain.export.insightface_import import infer_architecture, read_backbone_state

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
        from facetrain.checkpoint.layout import read_config, read_meta

        checkpoint = path / "checkpoints" / "step_00000002"
        _each(lambda: find_resume_point(path), lambda: read_meta(checkpoint), lambda: read_config(checkpoint))
    elif target == "ijb":
        from facetrain.eval.ijb_meta import read_ijb_meta

        read_ijb_meta(path)
    elif target == "yaml":
        from facetrain.config import load_config, validate

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
            _check_message(error)


def _check_message(error: Exception) -> None:
    text = str(error)
    if "\n" in text or len(text) > 1000 or not text:
        raise AssertionError(f"a message of {text.count(chr(10)) + 1} lines and {len(text)} characters")


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
)


# ---- the worker: runs cases in process, watching time, memory and file access ------------------


class _Watch:
    """An audit hook noting files opened under the fuzzing folder outside a case's input (reads) or
    output (writes); sys.addaudithook cannot be removed, so one watches every case in turn."""

    def __init__(self, root: Path):
        self.root = str(root)
        self.allowed_read = self.allowed_write = ""
        self.events: list[str] = []
        sys.addaudithook(self.hook)

    def hook(self, event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.path.abspath(os.fsdecode(args[0]))
        if not path.startswith(self.root + os.sep):
            return
        mode, flags = args[1], args[2]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
            flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        allowed = self.allowed_write if writing else self.allowed_read
        if not (allowed and path.startswith(allowed + os.sep)) and not path.startswith(
            self.allowed_write + os.sep
        ):
            self.events.append(f"{'wrote' if writing else 'read'} {path}")


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(
    target: str, seed: int, number: int, work: Path, watch: _Watch, timeout: float, max_mb: float
) -> dict:
    """One case in process; its outcome and, when it is a finding, why."""
    from facetrain.errors import FacetrainError

    rng = random.Random(f"{seed}:{target}:{number}")
    case = work / "cases" / f"{target}_{number}"
    inputs, out = case / "input", case / "out"
    out.mkdir(parents=True)
    watch.allowed_read, watch.allowed_write = str(case), str(out)
    path = _write_case(target, rng, inputs)
    watch.allowed_read, watch.events = str(inputs), []
    before, started = _peak_rss_mb(), time.monotonic()
    finding = None
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        _read(target, path, out)
        result = "ok"
    except FacetrainError as error:
        result = "error"
        try:
            _check_message(error)
        except AssertionError as bad:
            finding = str(bad)
    except _Timeout:
        result, finding = "timeout", f"over {timeout:g} s"
    except BaseException as error:  # noqa: BLE001 - any other exception is what the fuzzer looks for
        result = "exception"
        finding = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.monotonic() - started
    grown = _peak_rss_mb() - before
    if finding is None and grown > max_mb:
        finding = f"peak memory grew by {grown:.0f} MB"
    if finding is None and watch.events:
        finding = watch.events[0]
    return {
        "target": target,
        "case": number,
        "result": result,
        "seconds": round(seconds, 3),
        "finding": finding,
    }


class _Timeout(Exception):
    pass


def _alarm(_signum, _frame) -> None:
    raise _Timeout


def serve(work: Path, seed: int, timeout: float, max_mb: float) -> None:
    """Worker: read `target number` lines, answer one JSON line each."""
    import resource
    import warnings

    # address space, not memory: a case that allocates gigabytes fails here (MemoryError, a finding)
    # instead of bringing the machine's OOM killer; torch and onnx import within it
    limit = ADDRESS_SPACE_GB << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warnings.simplefilter("ignore")
    os.environ.setdefault("FACETRAIN_QUIET", "1")
    signal.signal(signal.SIGALRM, _alarm)
    watch = _Watch(work)
    for line in sys.stdin:
        target, number = line.split()
        outcome = run_case(target, seed, int(number), work, watch, timeout, max_mb)
        print(json.dumps(outcome), flush=True)


def fuzz(cases: int, seed: int, targets: tuple[str, ...] = TARGETS, timeout: float = 10.0,
         max_mb: float = 1024.0, work: Path | None = None) -> dict:  # fmt: skip
    """Run `cases` cases of each target; the summary with counts and findings."""
    own = tempfile.TemporaryDirectory(prefix="facetrain-fuzz-") if work is None else None
    work = Path(own.name if own else work)
    for secret in (work / "secret.txt", work / "cases" / "secret.txt"):
        _file(secret, b"TOPSECRET")
    started = time.monotonic()
    outcomes, worker = [], None
    try:
        for target in targets:
            for number in range(cases):
                if worker is None:
                    worker = _start_worker(work, seed, timeout, max_mb)
                outcome = _ask(worker, target, number, timeout * 3 + 30)
                if outcome is None:  # the worker died or hung past its own alarm
                    worker.kill()
                    worker.wait()
                    worker = None
                    outcome = {"target": target, "case": number, "result": "crash", "seconds": None,
                               "finding": "the worker crashed or hung"}  # fmt: skip
                printed = _drain(worker) if worker is not None else ""
                if printed and not outcome["finding"]:  # a C library's own line beside facetrain's
                    outcome["finding"] = f"printed to stderr: {printed.strip().splitlines()[0][:200]}"
                outcomes.append(outcome)
    finally:
        if worker is not None:
            worker.stdin.close()
            worker.wait()
        if own:
            own.cleanup()
    findings = [outcome for outcome in outcomes if outcome["finding"]]
    per_target = {
        target: {
            result: sum(1 for o in outcomes if o["target"] == target and o["result"] == result)
            for result in ("ok", "error", "exception", "timeout", "crash")
        }
        for target in targets
    }
    return {"cases": len(outcomes), "seed": seed, "seconds": round(time.monotonic() - started, 1),
            "per_target": per_target, "findings": findings}  # fmt: skip


def _start_worker(work: Path, seed: int, timeout: float, max_mb: float) -> subprocess.Popen:
    command = [sys.executable, __file__, "--serve", str(work), "--seed", str(seed), "--timeout", str(timeout),
               "--max-memory-mb", str(max_mb)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _drain(worker: subprocess.Popen) -> str:
    """What the worker wrote to stderr since the last call (C libraries write there directly)."""
    chunks = []
    while select.select([worker.stderr], [], [], 0)[0]:  # written before the answer was
        chunk = os.read(worker.stderr.fileno(), 65536)
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _ask(worker: subprocess.Popen, target: str, number: int, limit: float) -> dict | None:
    try:
        worker.stdin.write(f"{target} {number}\n")
        worker.stdin.flush()
    except BrokenPipeError:
        return None
    ready, _, _ = select.select([worker.stdout], [], [], limit)
    line = worker.stdout.readline() if ready else ""
    return json.loads(line) if line else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="cases per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", action="append", choices=TARGETS, help="only these targets")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a case may take")
    parser.add_argument("--max-memory-mb", type=float, default=1024.0)
    parser.add_argument("--out", type=Path, help="write the summary as JSON here")
    parser.add_argument("--replay", help="TARGET:N: write case N's input to --keep and run it here")
    parser.add_argument("--keep", type=Path, default=Path("fuzz_case"))
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.seed, args.timeout, args.max_memory_mb)
        return
    if args.replay:
        target, number = args.replay.split(":")
        signal.signal(signal.SIGALRM, _alarm)
        outcome = run_case(target, args.seed, int(number), args.keep, _Watch(args.keep.resolve()), args.timeout,
                           args.max_memory_mb)  # fmt: skip
        print(json.dumps(outcome))
        return
    summary = fuzz(args.cases, args.seed, tuple(args.target or TARGETS), args.timeout, args.max_memory_mb)
    text = json.dumps(summary, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text if summary["findings"] else f"{summary['cases']} cases, no findings, {summary['seconds']} s")
    sys.exit(1 if summary["findings"] else 0)


if __name__ == "__main__":
    main()
