"""Importing insightface arcface_torch backbones (`backbone.pth`, or a model zoo `.onnx`) as facetrain
checkpoints.

A `.pth` is read with `torch.load(weights_only=True)`, which restores tensors and plain containers
but never an arbitrary object, so a tampered file cannot run code; an `.onnx` is parsed as data
(`facetrain.interop.insightface_onnx`), never run. The architecture (an IResNet depth, or MobileFaceNet
`mbf`) is read from the file's keys or graph, or checked against `--arch`; every key and shape is
checked against facetrain's model before anything is written, and the first difference is reported
in one line.

The output is a facetrain checkpoint directory without a head: the backbone's tensors under
`app.model.backbone.` (the layout of `facetrain.checkpoint.names`), a `config.yaml` of the model and data
sections (`facetrain.interop.imported_config`), an empty `classes.json` and a `meta.json` that records
where the weights came from. `eval`, `export`, `embed` and `compare` take it as is, and
`facetrain.interop.load_model` reads the backbone with one call, which is what a later fine-tuning run
starts from.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import time
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from facetrain.checkpoint import holds_checkpoints
from facetrain.checkpoint.names import BACKBONE
from facetrain.checkpoint.storage import save_entries
from facetrain.choices import INSIGHTFACE_ARCHITECTURES
from facetrain.config import save_config
from facetrain.errors import FacetrainError
from facetrain.files import refuse_to_overwrite
from facetrain.input_files import open_regular
from facetrain.interop.imported_config import ImportedConfig, backbone_config, backbone_model
from facetrain.interop.insightface_onnx import read_iresnet_onnx
from facetrain.models import Backbone, build_backbone
from facetrain.models.iresnet import IRESNET_DEPTHS, IRESNET_INPUT_SIZE
from facetrain.models.state_match import first_nonfinite, first_state_mismatch
from facetrain.progress import ProgressBar

SOURCE_FORMAT = "insightface arcface_torch backbone.pth"
ONNX_SOURCE_FORMAT = "insightface ONNX model (torch2onnx)"
# The layer whose rows are the embedding, by architecture; an IResNet's is its `fc`.
EMBEDDING_WEIGHT = {"mbf": "features.layers.2.weight"}
MBF_MARKER = "conv_sep.layers.0.weight"
ONNX_FIRST_BYTE = b"\x08"  # a protobuf ModelProto opens with field 1, ir_version
# Where insightface and common training scripts keep the backbone's state dict inside a larger file:
# arcface_torch's resumable checkpoint_gpu_N.pt, and the usual {"state_dict": ...} / {"model": ...}.
WRAPPER_KEYS = ("state_dict_backbone", "state_dict", "model")
DDP_PREFIX = "module."
STAGES = 4
MAX_ARCHIVE_BYTES = 4 << 30
"""iresnet200 is 260 MB of float32s; arcface_torch's checkpoint_gpu_N.pt adds its head shard and the
optimizer's state to it, well under this."""
MAX_INFLATION = 4
"""Float weights deflate to no less than about 90%; a quarter is already no float tensor."""


@dataclass(frozen=True)
class ImportResult:
    checkpoint: Path
    architecture: str
    embedding_size: int
    tensors: int


def import_insightface(
    source: str | Path,
    architecture: str | None,
    out_dir: str | Path,
    overwrite: bool = False,
    progress: bool = True,
) -> ImportResult:
    """Check `source` against `architecture` (None: the one its keys or graph hold) and write it as a
    facetrain checkpoint at `out_dir`."""
    source, out_dir = Path(source), Path(out_dir)
    if architecture is not None and architecture not in INSIGHTFACE_ARCHITECTURES:
        raise FacetrainError(
            f"--arch {architecture}: insightface backbones import as one of {', '.join(INSIGHTFACE_ARCHITECTURES)}"
        )
    check_destination(out_dir, overwrite)
    with ProgressBar(total=3, desc="import", unit="step", disable=not progress) as bar:
        bar.set_postfix_str("read")
        source_format, details = SOURCE_FORMAT, {}
        if is_onnx(source):
            graph = read_iresnet_onnx(source, architecture)
            state, architecture = graph.state, graph.architecture
            source_format, details = ONNX_SOURCE_FORMAT, {"folded_batchnorms": graph.folded_batchnorms}
        else:
            state = read_backbone_state(source)
            architecture = architecture or infer_architecture(state, source)
        bar.update()
        bar.set_postfix_str("check")
        backbone = imported_backbone(state, architecture, source)
        bar.update()
        bar.set_postfix_str("write")
        config = imported_config(architecture, backbone.embedding_size)
        meta = {"architecture": architecture, "file": str(source.resolve()), "sha256": file_sha256(source)}
        write_backbone_checkpoint(backbone, config, out_dir, {**meta, **details}, source_format)
        bar.update()
    return ImportResult(out_dir, architecture, backbone.embedding_size, len(backbone.state_dict()))


def is_onnx(path: Path) -> bool:
    """An `.onnx` name, or a protobuf's first byte where a torch file has a zip's or a pickle's.
    Opened as a regular file only: reading a named pipe's first byte would wait forever."""
    if path.suffix.lower() == ".onnx":
        return True
    if not path.exists():
        return False  # load_weights_only names it
    with open_regular(path, "model") as handle:
        return handle.read(1) == ONNX_FIRST_BYTE


def infer_architecture(state: Mapping[str, object], path: Path) -> str:
    """The architecture whose keys `state` has: MobileFaceNet's `conv_sep`, or an IResNet's depth."""
    if MBF_MARKER in state:
        return "mbf"
    depths = tuple(_blocks_in(state, f"layer{index}.") for index in range(1, STAGES + 1))
    for name, known in IRESNET_DEPTHS.items():
        if known == depths:
            return name
    raise FacetrainError(
        f"{path}: its keys are neither an IResNet's (layers of {depths} blocks) nor MobileFaceNet's "
        f"({MBF_MARKER!r}); pass --arch ({', '.join(INSIGHTFACE_ARCHITECTURES)}) to see which keys differ"
    )


def read_backbone_state(path: Path) -> dict[str, torch.Tensor]:
    """The backbone's tensors by name from a weights-only file, unwrapped and without DDP's prefix."""
    return backbone_state(load_weights_only(path), path)


def backbone_state(loaded: object, path: Path) -> dict[str, torch.Tensor]:
    """The backbone's tensors by name in what `path` held, unwrapped and without DDP's prefix."""
    state = unwrap_state(loaded, path)
    if state and all(key.startswith(DDP_PREFIX) for key in state):
        state = {key[len(DDP_PREFIX) :]: value for key, value in state.items()}
    for key, value in state.items():
        if not torch.is_tensor(value):
            raise FacetrainError(f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor")
    return state


def check_weight_values(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], path: Path
) -> None:
    """Weights that load without complaint and still give a useless model: integers where floats belong
    (load_state_dict would round-trip them silently) and NaN or infinite values (a diverged or damaged
    run's file), which make every embedding NaN."""
    for key, value in state.items():
        if not expected[key].is_floating_point():
            continue  # BatchNorm's num_batches_tracked counter
        if not value.is_floating_point():
            raise FacetrainError(
                f"{path}: entry {key!r} holds {str(value.dtype).removeprefix('torch.')} values, not "
                "floating-point weights; the file is not a trained backbone's state dict"
            )
        nonfinite = first_nonfinite({key: value})
        if nonfinite is not None:
            raise FacetrainError(
                f"{path}: entry {nonfinite}; the file comes from a diverged run or is damaged, so it was not "
                "imported"
            )


def imported_backbone(state: Mapping[str, torch.Tensor], architecture: str, path: Path) -> Backbone:
    """facetrain's `architecture` holding `state`, after checking every key and shape against it.

    The embedding size is insightface's `num_features`, read from the rows of the layer that makes
    the embedding; the input is the 112x112 that layer was sized for.
    """
    key = EMBEDDING_WEIGHT.get(architecture, "fc.weight")
    fc_weight = state.get(key)
    if fc_weight is None or fc_weight.dim() != 2:
        raise FacetrainError(
            f"{path}: no 2-D {key!r} entry, so this is not an insightface {architecture} backbone"
            + _depth_hint(state, architecture)
        )
    if fc_weight.shape[0] == 0:
        raise FacetrainError(f"{path}: {key!r} has 0 rows, so the backbone would embed into 0 numbers")
    backbone = build_backbone(backbone_model(architecture, int(fc_weight.shape[0])), IRESNET_INPUT_SIZE)
    check_state_matches(state, backbone.state_dict(), architecture, path)
    check_weight_values(state, backbone.state_dict(), path)
    backbone.load_state_dict(state, strict=True)
    return backbone.eval()


def check_state_matches(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], architecture: str, path: Path
) -> None:
    mismatch = first_state_mismatch(state, expected, architecture)
    if mismatch is not None:
        raise FacetrainError(f"{path}: {mismatch}{_depth_hint(state, architecture)}")


def imported_config(architecture: str, embedding_size: int) -> ImportedConfig:
    """The config an imported backbone is rebuilt from: insightface's 112x112 input, no dropout."""
    return backbone_config(architecture, embedding_size, IRESNET_INPUT_SIZE)


def write_backbone_checkpoint(
    backbone: Backbone,
    config: ImportedConfig,
    out_dir: Path,
    imported_from: dict,
    source_format: str = SOURCE_FORMAT,
) -> None:
    """Write a head-less checkpoint beside `out_dir` and move it into place only once it is complete."""
    entries = {BACKBONE + key: value.detach().cpu() for key, value in backbone.state_dict().items()}
    meta = {
        "embedding_size": backbone.embedding_size,
        "imported_from": {"format": source_format, **imported_from},
    }
    write_imported_checkpoint(entries, meta, config, [], out_dir)


def write_imported_checkpoint(
    entries: dict[str, torch.Tensor],
    meta: dict,
    config: ImportedConfig,
    class_names: list[str],
    out_dir: Path,
) -> None:
    """A checkpoint of `entries` (facetrain's tensor layout), written beside `out_dir` and moved into
    place only once complete; `meta` overrides the step-0, one-rank, head-less defaults."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        save_entries(entries, tmp)
        meta = {
            "step": 0,
            "epoch": 0,
            "consumed": 0,
            "best_accuracy": None,
            "best_step": None,
            "world_size": 1,
            "num_classes": len(class_names),
            "evaluation": {},
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            **meta,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        (tmp / "classes.json").write_text(json.dumps(class_names))
        save_config(config, tmp / "config.yaml")
        _replace_directory(tmp, out_dir)
    except OSError as error:  # named as the folder the user asked for, not its temporary twin
        raise OSError(error.errno, error.strerror, str(out_dir)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_destination(out_dir: Path, overwrite: bool) -> None:
    """Refuse to replace anything but an earlier import, so `--overwrite` never deletes user files nor
    a training checkpoint (a run's `last` may name it, and resuming falls back only over damaged ones).
    Nor is an import written into a run's checkpoints folder, where it would pass for one of its steps.
    """
    if out_dir.parent.name == "checkpoints" and holds_checkpoints(out_dir.parent.parent):
        raise FacetrainError(
            f"-o {out_dir} lies in the checkpoints folder of the training run {out_dir.parent.parent}, "
            "where an import would pass for one of its checkpoints; choose another -o"
        )
    if not overwrite:
        refuse_to_overwrite([out_dir])
        return
    if out_dir.exists() and not (_is_import(out_dir) or _is_empty_directory(out_dir)):
        raise FacetrainError(
            f"-o {out_dir} exists and is not an earlier import; "
            "--overwrite only replaces an earlier import, so choose another -o"
        )


def _is_import(path: Path) -> bool:
    """A checkpoint `facetrain import` wrote (its meta.json says where it came from)."""
    if not (path.is_dir() and (path / ".metadata").is_file()):
        return False
    try:
        meta = json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "imported_from" in meta


def _is_empty_directory(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _replace_directory(complete: Path, out_dir: Path) -> None:
    """Swap `complete` in for `out_dir`; the old directory is removed only after the new one is there."""
    if not out_dir.exists():
        os.replace(complete, out_dir)
        return
    retired = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    os.replace(out_dir, retired)
    os.replace(complete, out_dir)
    shutil.rmtree(retired)


def load_weights_only(path: Path) -> object:
    if not path.is_file():
        raise FacetrainError(f"{path} does not exist or is not a file; pass insightface's backbone.pth")
    check_archive_sizes(path)
    try:
        with warnings.catch_warnings():  # torch's note on a plain pickle's protocol; refused below anyway
            warnings.filterwarnings("ignore", message=".*pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        refused = re.search(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.]+)", str(error))
        if refused:
            raise FacetrainError(
                f"{path}: refused: it pickles {refused.group(1)}, not only tensors, and unpickling it "
                "could run code; save `model.state_dict()` with torch.save and import that"
            ) from None
        raise FacetrainError(
            f"{path}: not a weights-only PyTorch file (a plain pickle, or one torch.save did not write: "
            f"{_first_reason(error)}), so it was not loaded and nothing in it ran; save `model.state_dict()` "
            "with torch.save and import that"
        ) from None
    except Exception as error:  # torch.load on bytes it did not write fails in many ways, all the same here
        raise FacetrainError(
            f"{path}: not a readable PyTorch weights file ({type(error).__name__}: {_first_reason(error)}); "
            "pass the backbone.pth that torch.save wrote, or an insightface .onnx"
        ) from None


def check_archive_sizes(path: Path) -> None:
    """Refuse a torch.save archive whose entries would take more memory than the file can hold data
    for, before torch allocates them: torch.save stores entries uncompressed, but its reader also
    inflates deflated ones, so a 1 MB file can declare a 1 GiB tensor. The declared sizes are what
    the reader allocates, so checking them bounds the memory."""
    try:
        if not zipfile.is_zipfile(path):
            return  # the legacy format, a plain pickle: torch.load refuses or reads it as it is
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (
        zipfile.BadZipFile,
        OSError,
        ValueError,
        NotImplementedError,
    ) as error:  # a "zip file version 25.5"
        raise FacetrainError(f"{path}: not a readable torch.save archive ({str(error)[:200]})") from None
    total = sum(entry.file_size for entry in entries)
    if total > MAX_ARCHIVE_BYTES:
        raise FacetrainError(
            f"{path}: its entries hold {total} bytes, more than the {MAX_ARCHIVE_BYTES} of the largest "
            "backbone facetrain imports with its training state; pass the backbone's state dict alone"
        )
    for entry in entries:
        if (
            entry.compress_type != zipfile.ZIP_STORED
            and entry.file_size > MAX_INFLATION * entry.compress_size + 4096
        ):
            raise FacetrainError(
                f"{path}: entry {entry.filename[:80]!r} inflates from {entry.compress_size} to {entry.file_size} "
                "bytes; torch.save never compresses, so the file was made to exhaust memory or damaged; "
                "save `model.state_dict()` with torch.save and import that"
            )


def _first_reason(error: Exception) -> str:
    """What was wrong with the file, without torch's own advice (to load it with weights_only=False,
    which would let it run code)."""
    if not isinstance(error, (RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError)):
        return "its bytes are neither a torch.save archive nor a pickle"
    text = str(error)
    detail = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    if detail:
        return _first_sentences(detail.group(1).strip())
    line = (text.strip().splitlines() or [""])[0]
    if not line or "weights_only" in line or "Weights only load failed" in line:
        return f"{type(error).__name__} while unpickling"
    return _first_sentences(line)


def _first_sentences(text: str, limit: int = 200) -> str:
    """`text` within `limit` characters, cut after a whole sentence (torch's `... This is an internal
    miniz error. If you are seeing this error, there is a high likelihood that your checkpoint file is
    co` was cut mid-word), else after a whole word, marked with "..."."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    end = head.rfind(". ")
    if end > 0:
        return head[: end + 1]
    return head[: head.rfind(" ")].rstrip(",;:") + "..." if " " in head else head + "..."


def unwrap_state(loaded: object, path: Path) -> dict[str, object]:
    if not isinstance(loaded, Mapping):
        raise FacetrainError(f"{path} holds a {type(loaded).__name__}, not a state dict of tensors by name")
    for key in WRAPPER_KEYS:
        if isinstance(loaded.get(key), Mapping):
            return dict(loaded[key])
    if any(torch.is_tensor(value) for value in loaded.values()):
        return dict(loaded)
    found = ", ".join(repr(key) for key in list(loaded)[:5]) or "none"
    raise FacetrainError(
        f"{path} holds no state dict: expected tensors by name, or a dict of them under "
        f"{' or '.join(repr(key) for key in WRAPPER_KEYS)} (keys found: {found})"
    )


def _depth_hint(state: Mapping[str, object], architecture: str) -> str:
    """Name the architecture the file's keys have, when it is another than the one asked for."""
    if MBF_MARKER in state and architecture != "mbf":
        return "; its keys are MobileFaceNet's: pass --arch mbf"
    depths = tuple(_blocks_in(state, f"layer{index}.") for index in range(1, STAGES + 1))
    matching = [name for name, known in IRESNET_DEPTHS.items() if known == depths]
    if matching and matching[0] != architecture:
        return f"; its layers hold {depths} blocks, which is {matching[0]}: pass --arch {matching[0]}"
    return ""


def _blocks_in(state: Mapping[str, object], prefix: str) -> int:
    indices = {key[len(prefix) :].split(".", 1)[0] for key in state if key.startswith(prefix)}
    return len([index for index in indices if index.isdigit()])


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()
