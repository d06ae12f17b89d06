"""Importing insightface arcface_torch `backbone.pth` files as facetrain checkpoints.

The file is read with `torch.load(weights_only=True)`, which restores tensors and plain containers
but never an arbitrary object, so a tampered file cannot run code. Every key and shape is checked
against facetrain's IResNet of the requested depth before anything is written, and the first
difference is reported in one line.

The output is a facetrain checkpoint directory without a head: the backbone's tensors under
`backbone/...` (the layout of `facetrain.checkpoints`), `config.yaml` naming the architecture, an
empty `classes.json` and a `meta.json` that records where the weights came from. `eval`, `export`,
`embed` and `compare` take it as is, and `facetrain.checkpoints.load_backbone` reads the backbone and
its config with one call, which is what a later fine-tuning run starts from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import re
import shutil
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from facetrain.checkpoints import holds_checkpoints
from facetrain.config import Config, ModelConfig, save_config
from facetrain.errors import FacetrainError
from facetrain.files import refuse_to_overwrite
from facetrain.models import Backbone, build_backbone
from facetrain.models.iresnet import IRESNET_DEPTHS, IRESNET_INPUT_SIZE
from facetrain.models.state_match import first_state_mismatch
from facetrain.parallel.checkpoint_io import save_tensors
from facetrain.progress import ProgressBar

SOURCE_FORMAT = "insightface arcface_torch backbone.pth"
# Where insightface and common training scripts keep the backbone's state dict inside a larger file:
# arcface_torch's resumable checkpoint_gpu_N.pt, and the usual {"state_dict": ...} / {"model": ...}.
WRAPPER_KEYS = ("state_dict_backbone", "state_dict", "model")
DDP_PREFIX = "module."
STAGES = 4


@dataclass(frozen=True)
class ImportResult:
    checkpoint: Path
    architecture: str
    embedding_size: int
    tensors: int


def import_insightface(
    source: str | Path, architecture: str, out_dir: str | Path, overwrite: bool = False, progress: bool = True
) -> ImportResult:
    """Check `source` against `architecture` and write it as a facetrain checkpoint at `out_dir`."""
    source, out_dir = Path(source), Path(out_dir)
    if architecture not in IRESNET_DEPTHS:
        raise FacetrainError(
            f"--arch {architecture}: insightface backbones import as one of {', '.join(IRESNET_DEPTHS)}"
        )
    check_destination(out_dir, overwrite)
    with ProgressBar(total=3, desc="import", unit="step", disable=not progress) as bar:
        bar.set_postfix_str("read")
        state = read_backbone_state(source)
        bar.update()
        bar.set_postfix_str("check")
        backbone = imported_backbone(state, architecture, source)
        bar.update()
        bar.set_postfix_str("write")
        config = imported_config(architecture, backbone.embedding_size)
        meta = {"architecture": architecture, "file": str(source.resolve()), "sha256": file_sha256(source)}
        write_backbone_checkpoint(backbone, config, out_dir, meta)
        bar.update()
    return ImportResult(out_dir, architecture, backbone.embedding_size, len(backbone.state_dict()))


def read_backbone_state(path: Path) -> dict[str, torch.Tensor]:
    """The backbone's tensors by name from a weights-only file, unwrapped and without DDP's prefix."""
    loaded = _load_weights_only(path)
    state = _unwrap(loaded, path)
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
        bad = int((~torch.isfinite(value)).sum())
        if bad:
            raise FacetrainError(
                f"{path}: entry {key!r} holds {bad} NaN or infinite values of {value.numel()}; the file comes "
                "from a diverged run or is damaged, so it was not imported"
            )


def imported_backbone(state: Mapping[str, torch.Tensor], architecture: str, path: Path) -> Backbone:
    """facetrain's `architecture` holding `state`, after checking every key and shape against it.

    The embedding size is insightface's `num_features`, read from the FC's rows; the input is the
    112x112 its FC was sized for.
    """
    fc_weight = state.get("fc.weight")
    if fc_weight is None or fc_weight.dim() != 2:
        raise FacetrainError(
            f"{path}: no 2-D 'fc.weight' entry, so this is not an insightface IResNet backbone"
            + _depth_hint(state, architecture)
        )
    if fc_weight.shape[0] == 0:
        raise FacetrainError(f"{path}: 'fc.weight' has 0 rows, so the backbone would embed into 0 numbers")
    backbone = build_backbone(_model_config(architecture, int(fc_weight.shape[0])), IRESNET_INPUT_SIZE)
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


def imported_config(architecture: str, embedding_size: int) -> Config:
    """The config an imported backbone is rebuilt from: insightface's 112x112 input, no dropout."""
    config = Config()
    data = dataclasses.replace(config.data, image_size=list(IRESNET_INPUT_SIZE))
    return dataclasses.replace(config, data=data, model=_model_config(architecture, embedding_size))


def write_backbone_checkpoint(backbone: Backbone, config: Config, out_dir: Path, imported_from: dict) -> None:
    """Write a head-less checkpoint beside `out_dir` and move it into place only once it is complete."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        entries = {f"backbone/{key}": value.detach().cpu() for key, value in backbone.state_dict().items()}
        save_tensors(entries, tmp)
        meta = {
            "step": 0,
            "epoch": 0,
            "consumed": 0,
            "best_accuracy": None,
            "best_step": None,
            "world_size": 1,
            "num_classes": 0,
            "embedding_size": backbone.embedding_size,
            "evaluation": {},
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "imported_from": {"format": SOURCE_FORMAT, **imported_from},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        (tmp / "classes.json").write_text("[]")
        save_config(config, tmp / "config.yaml")
        _replace_directory(tmp, out_dir)
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


def _load_weights_only(path: Path) -> object:
    if not path.is_file():
        raise FacetrainError(f"{path} does not exist or is not a file; pass insightface's backbone.pth")
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
    except (
        Exception
    ) as error:  # garbage bytes read as pickle opcodes fail in any way (IndexError, KeyError...)
        raise FacetrainError(
            f"{path}: not a readable PyTorch weights file ({type(error).__name__}: {_first_reason(error)})"
        ) from None


def _first_reason(error: Exception) -> str:
    text = str(error)
    detail = re.search(r"WeightsUnpickler error:\s*([^\n]+)", text)
    line = detail.group(1) if detail else (text.strip().splitlines() or [type(error).__name__])[0]
    return line[:200]


def _unwrap(loaded: object, path: Path) -> dict[str, object]:
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


def _model_config(architecture: str, embedding_size: int) -> ModelConfig:
    return dataclasses.replace(
        Config().model, backbone=architecture, embedding_size=embedding_size, dropout=0.0
    )


def _depth_hint(state: Mapping[str, object], architecture: str) -> str:
    """Name the depth the file's keys have, when it is another IResNet than the one asked for."""
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
