"""Finding a checkpoint (a directory, a `last`/`best` pointer, a run), telling whether it is whole, and
reading its small files: meta.json, classes.json, config.yaml."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from facetrain.checkpoint.storage import find_data_damage
from facetrain.config import Config, from_dict
from facetrain.errors import FacetrainError

POINTERS = ("last", "best")
STEP_NAME = re.compile(r"step_\d{8}")


def is_checkpoint(path: Path) -> bool:
    """A finished checkpoint directory: named step_NNNNNNNN (a `.tmp` one is still being written),
    with DCP's index and facetrain's meta.json."""
    return (
        STEP_NAME.fullmatch(path.name) is not None
        and (path / ".metadata").is_file()
        and (path / "meta.json").is_file()
    )


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's finished checkpoints, oldest step first."""
    root = run_dir / "checkpoints"
    return sorted(p for p in root.glob("step_*") if is_checkpoint(p)) if root.is_dir() else []


def holds_checkpoints(run_dir: Path) -> bool:
    """Whether training into `run_dir` would write over an earlier run's checkpoints."""
    root = run_dir / "checkpoints"
    return any((root / name).is_file() for name in POINTERS) or bool(complete_checkpoints(run_dir))


def find_damage(checkpoint: Path) -> str | None:
    """Why a finished checkpoint cannot be resumed from (a file missing, cut short or unreadable), or None."""
    for name in _READERS:
        try:
            _parsed(checkpoint / name)
        except _Unreadable as error:
            return str(error)
    return find_data_damage(checkpoint)


class _Unreadable(Exception):
    pass


_READERS = {
    "meta.json": (json.loads, dict),
    "classes.json": (json.loads, list),
    "config.yaml": (yaml.safe_load, dict),
}


def _parsed(path: Path):
    """The parsed contents of one of a checkpoint's small files; _Unreadable says why not."""
    parse, kind = _READERS[path.name]
    try:
        value = parse(path.read_text())
    except OSError as error:
        raise _Unreadable(f"{path} is missing or unreadable ({error.strerror or error})") from None
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _Unreadable(
            f"{path} is missing or unreadable (not valid {path.suffix[1:]}: {reason})"
        ) from None
    if not isinstance(value, kind):
        raise _Unreadable(f"{path} is missing or unreadable (not a {kind.__name__} of facetrain's)")
    return value


def damaged_checkpoint_error(checkpoint: Path, damage: str) -> FacetrainError:
    """One line for a checkpoint that cannot be read, offering the newest whole one before it."""
    earlier = [p for p in complete_checkpoints(checkpoint.parent.parent) if p.name < checkpoint.name]
    whole = [p for p in reversed(earlier) if find_damage(p) is None]
    offer = f"use the one before it, {whole[0]}" if whole else "use another checkpoint"
    return FacetrainError(f"checkpoint {checkpoint} is damaged: {damage}; {offer}")


def _pointer_target(pointer: Path) -> Path:
    return pointer.parent / pointer.read_text().strip()


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from itself, a `last`/`best` pointer, a checkpoints dir or a run dir.

    A run without a `last` pointer (it was lost, or the run stopped before writing it) resolves to its
    newest finished checkpoint.
    """
    path = Path(path)
    for candidate in (path, path / "last", path / "checkpoints" / "last"):
        if candidate.is_file() and candidate.name in POINTERS:
            target = _pointer_target(candidate)
            if (target / ".metadata").is_file():
                return target
            raise FacetrainError(f"{candidate} points to {target.name}, which is missing or incomplete")
        if (candidate / ".metadata").is_file() and (candidate / "meta.json").is_file():
            return candidate
    run_dir = path.parent if path.name == "checkpoints" else path
    finished = complete_checkpoints(run_dir)
    if finished:
        return finished[-1]
    raise FacetrainError(
        f"no checkpoint at {path}: expected a checkpoint directory, a run directory or a pointer"
    )


def find_resume_point(run_dir: Path) -> tuple[Path | None, list[str]]:
    """What `--resume auto` resumes from, and notes on what it passed over and why.

    The `last` pointer's checkpoint when it is whole; otherwise (the pointer is missing or names a
    missing or damaged checkpoint) the newest whole checkpoint before it. Step order, not file times,
    decides "newest", so a run directory copied elsewhere resumes the same way. None when the run has
    no finished checkpoint; an error when it has some but none is whole (starting afresh would write
    over them).
    """
    finished = complete_checkpoints(run_dir)
    pointer = run_dir / "checkpoints" / "last"
    notes: list[str] = []
    candidates = finished
    if pointer.is_file():
        target = _pointer_target(pointer)
        if target in finished:
            candidates = finished[: finished.index(target) + 1]
        else:
            notes.append(f"{pointer} names {target.name}, which is missing or incomplete")
            candidates = [p for p in finished if p.name < target.name] or finished
    elif finished:
        notes.append(f"{pointer} is missing; taking the newest finished checkpoint")
    for checkpoint in reversed(candidates):
        damage = find_damage(checkpoint)
        if damage is None:
            return checkpoint, notes
        notes.append(f"skipping damaged checkpoint {checkpoint.name}: {damage}")
    if finished:
        raise FacetrainError(
            f"no whole checkpoint to resume in {run_dir / 'checkpoints'} ({notes[-1]}); "
            "remove the damaged ones to start afresh, or choose another train.output_dir"
        )
    return None, notes


def read_meta(checkpoint: Path) -> dict:
    return _read(checkpoint, "meta.json")


def read_classes(checkpoint: Path) -> list[str]:
    """The class names of the head's rows, in row order."""
    return [str(name) for name in _read(checkpoint, "classes.json")]


def read_config(checkpoint: Path) -> Config:
    path = checkpoint / "config.yaml"
    return from_dict(Config, _read(checkpoint, "config.yaml"), source=str(path))


def _read(checkpoint: Path, name: str):
    """A checkpoint's small file, read as `find_damage` reads it: a damaged one is one line, the same
    whether training resumes from it, `--init` starts from it or `export` reads it."""
    try:
        return _parsed(checkpoint / name)
    except _Unreadable as error:
        raise damaged_checkpoint_error(checkpoint, str(error)) from None
