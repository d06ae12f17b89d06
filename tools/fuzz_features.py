"""The fuzzer's targets for the features of #57 (`tools/fuzz_inputs.py`): `pack`'s output read back,
the teacher and timm settings, and the adaptive margins' running state through a checkpoint.

- `pack`: a folder of 1 to 3 identities, named with hostile tokens (`..x`, a newline, unicode, 200
  characters), holding valid, mutated, empty, text, other-sized and symlinked images and folders
  named like images, packed by `pack_folder`; when it succeeds, the `.rec`/`.idx` read back must give
  the folder's labels and bytes exactly (anything else is a finding).
- `teacher`: `loss.teacher` pointing at a small checkpoint with one of its files mutated, at garbage
  named like each model format, at a run folder, a folder or nothing, with a mutated teacher_loss or
  teacher_weight and an embedding size that may differ; validated, built and run on a batch, whose
  term must be finite.
- `timm`: `model.backbone: timm:<name>` with real names, their pretrained tags and mutated ones;
  validated without network access (a socket opened is a finding), and a name that passes must build.
- `margin`: an adaptive margin's running state set to NaN, infinities, huge, negative, zero or another
  shape or dtype, saved in a checkpoint and loaded into a fresh head as a resume does, then a step; a
  finite state must give a finite loss and state.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = [
    "alice",
    "..x",
    "a\nb",
    "ü名",
    " ",
    "-",
    "a b",
    "n" * 200,
    "x.png",
    "0",
    "%s",
    "${HOME}",
    "\\",
    "\t",
    ".",
]
TIMM_NAMES = ["resnet18", "resnet18.a1_in1k", "mobilenetv3_small_050", "mobilenetv3_small_050.lamb_in1k",
              "resnet18.nonexistent_tag", "nosuchmodel", "hf-hub:timm/resnet18.a1_in1k", "resnet18.", ".a1_in1k",
              "resnet18..a1", "resnet18.a1_in1k.a1_in1k", "hf_hub:x/y", "local-dir:/tmp", "resnet18/../x",
              "resnet*", "RESNET18", "resnet18 ", "resnet18\x00", "resnet18\n", "résnet18", "", "timm:resnet18"]  # fmt: skip
ADAPTIVE = ["adaface", "magface", "curricularface", "elasticface_arc", "elasticface_cos"]
VALUES = [float("nan"), float("inf"), -float("inf"), 1e38, -1e38, 1e30, 0.0, -1.0, 1e-30, 5.0, 2**63 - 1]


def _png(side: int, seed: int) -> bytes:
    import cv2
    import numpy as np

    pixels = np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)
    return cv2.imencode(".png", pixels)[1].tobytes()


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_pack_case(rng: random.Random, folder: Path) -> Path:
    from tools.fuzz_cases import mutate_bytes

    root = folder / "faces"
    root.mkdir(parents=True)
    names = rng.sample(NAMES, rng.randint(1, 3))
    for identity in names:
        for index in range(rng.randint(1, 3)):
            path = root / identity / f"{index}.png"
            kind = rng.randrange(30)  # mostly good images, so most cases pack and are read back
            if kind == 0:
                _write(path, mutate_bytes(_png(12, index), rng))
            elif kind == 1:
                _write(path, b"")
            elif kind == 2:
                _write(path, b"not an image\n")
            elif kind == 3:
                _write(path, _png(rng.choice([8, 16]), index))
            elif kind == 4:
                path.mkdir(parents=True)
            elif kind == 5:
                target = _write(folder / "elsewhere" / f"{identity[:50]}{index}.png", _png(12, index))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.symlink_to(target)
            else:
                _write(path, _png(12, rng.randrange(1000)))
    return root


def read_pack_case(path: Path, out: Path) -> None:
    from facetrain.data.folder import scan_image_folder
    from facetrain.data.pack import pack_folder
    from facetrain.data.recordio import scan_recordio

    packed = pack_folder(path, out / "packed" / "train.rec")
    original, back = scan_image_folder(path), scan_recordio(packed.rec_path, progress=False)
    if back.labels.tolist() != original.labels.tolist():
        raise AssertionError("the packed labels read back differ from the folder's")
    for index in range(len(original.labels)):
        if back.reader.read(index) != original.reader.read(index):
            raise AssertionError(f"image {index} read back differs from {original.reader.name(index)}")


_TEACHER_FILES: dict[str, bytes] = {}


def _teacher_files() -> dict[str, bytes]:
    """A small backbone's checkpoint as file name -> bytes, written once per worker."""
    if not _TEACHER_FILES:
        import tempfile

        import torch

        from facetrain.checkpoint.names import BACKBONE
        from facetrain.interop.insightface_import import write_imported_checkpoint
        from facetrain.models import build_backbone
        from facetrain.train.run_config import Config

        config = Config()
        config.model.backbone, config.model.embedding_size, config.data.image_size = "small", 16, [32, 32]
        torch.manual_seed(0)
        backbone = build_backbone(config.model, image_size=(32, 32))
        entries = {BACKBONE + key: value for key, value in backbone.state_dict().items()}
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = Path(folder) / "teacher"
            write_imported_checkpoint(entries, {"embedding_size": 16}, config, [], checkpoint)
            _TEACHER_FILES.update({p.name: p.read_bytes() for p in checkpoint.iterdir() if p.is_file()})
    return _TEACHER_FILES


def write_teacher_case(rng: random.Random, folder: Path) -> Path:
    from tools.fuzz_cases import TOKENS, mutate_bytes

    checkpoint = folder / "teacher"
    files = _teacher_files()
    victim = rng.choice(sorted(files))
    for name, data in files.items():
        _write(checkpoint / name, mutate_bytes(data, rng) if name == victim and rng.random() < 0.6 else data)
    kind = rng.randrange(8)
    if kind == 0:
        teacher = _write(folder / rng.choice(["model.onnx", "model.pt", "model.safetensors", "model.dat", "x.pth"]),
                         mutate_bytes(rng.choice(list(files.values())), rng))  # fmt: skip
    elif kind == 1:  # a run folder: its checkpoints/last names the checkpoint
        run = folder / "run"
        (run / "checkpoints").mkdir(parents=True)
        checkpoint.rename(run / "checkpoints" / "step_00000002")
        _write(run / "checkpoints" / "last", rng.choice([b"step_00000002", b"step_00000009", b"../../x"]))
        teacher = run
    elif kind == 2:
        teacher = folder / rng.choice(["missing", "", "teacher/..", "teacher/meta.json"])
    else:
        teacher = checkpoint
    loss = {"teacher": str(teacher), "teacher_loss": "cosine", "teacher_weight": 1.0}
    if rng.random() < 0.3:
        key = rng.choice(["teacher_loss", "teacher_weight"])
        loss[key] = rng.choice([*TOKENS[:12], "l2", "cosine", 0, -1, 1e30, None, [1]])
        if isinstance(loss[key], bytes):
            loss[key] = loss[key].decode("latin-1")
    config = {
        "model": {"backbone": "small", "embedding_size": rng.choice([16, 16, 16, 32])},
        "data": {"image_size": [32, 32]},
        "loss": loss,
    }
    return _write(folder / "config.yaml", json.dumps(config).encode())


def read_teacher_case(path: Path, out: Path) -> None:
    import torch

    from facetrain.train.distillation import build_distillation
    from facetrain.train.run_checks import validate
    from facetrain.train.run_config import load_config

    cfg = load_config(path)
    validate(cfg, 1)
    distillation = build_distillation(cfg.loss, cfg.model.embedding_size, torch.device("cpu"), 4)
    images = torch.rand(2, 3, 32, 32)
    term = distillation(images, torch.randn(2, cfg.model.embedding_size))
    if not torch.isfinite(term):
        raise AssertionError(f"the distillation term is {float(term)}")


def write_timm_case(rng: random.Random, folder: Path) -> Path:
    from tools.fuzz_cases import TOKENS, mutate_bytes

    name = rng.choice(TIMM_NAMES)
    if rng.random() < 0.4:
        name = mutate_bytes(name.encode(), rng).decode("utf-8", "replace")
    elif rng.random() < 0.2:
        name += rng.choice(TOKENS).decode("latin-1")
    config = {"model": {"backbone": f"timm:{name}", "embedding_size": 8}, "data": {"image_size": [32, 32]}}
    return _write(folder / "config.yaml", json.dumps(config).encode())


def read_timm_case(path: Path, out: Path) -> None:
    import socket

    from facetrain.models import build_backbone
    from facetrain.train.run_checks import validate
    from facetrain.train.run_config import load_config

    cfg = load_config(path)
    real = socket.socket.connect
    socket.socket.connect = _no_network  # validation must not reach out (the worker has no network)
    try:
        validate(cfg, 1)
    finally:
        socket.socket.connect = real
    build_backbone(cfg.model, image_size=(32, 32))


def _no_network(*args, **kwargs):
    raise AssertionError("validation opened a network connection")


def write_margin_case(rng: random.Random, folder: Path) -> Path:
    name = rng.choice(ADAPTIVE)
    mutations = []
    for _ in range(rng.randint(1, 2)):
        mutations.append({"value": rng.choice(VALUES), "shape": rng.choice([[], [], [], [2], [1, 1]]),
                          "dtype": rng.choice(["float32", "float32", "float64", "int64", "bfloat16"]),
                          "pick": rng.randrange(4)})  # fmt: skip
    return _write(folder / "case.json", json.dumps({"margin": name, "mutations": mutations}).encode())


def read_margin_case(path: Path, out: Path) -> None:
    import math

    import torch

    from facetrain.checkpoint import CheckpointStates
    from facetrain.checkpoint.reader import load_checkpoint
    from facetrain.checkpoint.writer import save_checkpoint
    from facetrain.heads import ShardedMarginHead
    from facetrain.parallel.dims import init_parallel
    from facetrain.train.optim import build_optimizer
    from facetrain.train.run_config import Config
    from facetrain.train.state import TrainState

    case = json.loads(path.read_text())
    cfg = Config()
    cfg.model.embedding_size, cfg.head.margin = 8, case["margin"]

    def parts(seed: int):
        torch.manual_seed(seed)
        backbone = torch.nn.Sequential(torch.nn.Linear(8, 8))
        head = ShardedMarginHead(5, 8, margin=case["margin"], scale=16.0)
        return backbone, head, build_optimizer(cfg.optim, backbone, head)

    backbone, head, optimizer = parts(0)
    names = sorted(dict(head.margin_state.named_buffers()))
    finite = True
    for mutation in case["mutations"]:
        if not names:
            break
        name = names[mutation["pick"] % len(names)]
        value = torch.full(mutation["shape"], mutation["value"], dtype=torch.float64)
        dtype = getattr(torch, mutation["dtype"])
        value = (
            value.nan_to_num(0, 2**62, -(2**62)).to(dtype) if not dtype.is_floating_point else value.to(dtype)
        )
        finite = finite and bool(torch.isfinite(value.double()).all()) and abs(mutation["value"]) < 1e30
        setattr(head.margin_state, name, value)
    dims = init_parallel()
    train_state, classes = TrainState(step=1, epoch=0, consumed=4), [str(k) for k in range(5)]
    save_checkpoint(
        out / "run", dims, CheckpointStates(train_state, cfg, classes, backbone, head, optimizer, None)
    )
    backbone, head, optimizer = parts(1)
    load_checkpoint(out / "run", dims, backbone, head, optimizer, None)
    embeddings = torch.randn(4, 8) * 10
    loss, _ = head(backbone(embeddings), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    state_finite = all(bool(torch.isfinite(v.double()).all()) for v in head.margin_state.buffers())
    if finite and not (math.isfinite(loss.item()) and state_finite):
        raise AssertionError(f"a finite {case['margin']} state gave a loss of {float(loss)}")


TARGETS = {
    "pack": (write_pack_case, read_pack_case),
    "teacher": (write_teacher_case, read_teacher_case),
    "timm": (write_timm_case, read_timm_case),
    "margin": (write_margin_case, read_margin_case),
}
READER_MODULES = ("facetrain.data.pack", "facetrain.train.distillation", "facetrain.models", "facetrain.heads",
                  "facetrain.checkpoint.writer", "facetrain.checkpoint.reader", "timm")  # fmt: skip
