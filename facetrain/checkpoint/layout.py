"""Finding a checkpoint (a directory, a `last`/`best` pointer, a run), telling whether it is whole, and
reading its small files: meta.json, classes.json, config.yaml."""

from __future__ import annotations

import json
import re
from pathlib import Path

from facetrain.checkpoint.storage import find_data_damage
from facetrain.config.plain_yaml import PlainYamlError, parse_plain_yaml
from facetrain.errors import FacetrainError
from facetrain.input_files import UnreadableInput, read_regular_bytes

POINTERS = ("last", "best")
STEP_NAME = re.compile(r"step_\d{8}")
UNFINISHED_NAME = re.compile(r"step_\d{8}\.(tmp|deleting|replaced)")
"""A checkpoint being written (`.tmp`, renamed once whole), removed or replaced: its files may change
or vanish while read, so it is never read (`facetrain/checkpoint/writer.py`)."""
MAX_POINTER_BYTES = 4096
META_COUNTS = {
    "step": 0,
    "epoch": 0,
    "consumed": 0,
    "best_step": 0,
    "world_size": 1,
    "num_classes": 0,
    "embedding_size": 1,
}
META_OPTIONAL = {"best_step"}
MAX_META_COUNT = 2**53  # a float64 holds every count below it exactly


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's finished checkpoints, oldest step first: named step_NNNNNNNN (a `.tmp` one is still
    being written), with DCP's index and facetrain's meta.json."""
    root = run_dir / "checkpoints"
    named = [p for p in root.glob("step_*") if STEP_NAME.fullmatch(p.name)]
    return sorted(p for p in named if (p / ".metadata").is_file() and (p / "meta.json").is_file())


def holds_checkpoints(run_dir: Path) -> bool:
    """Whether training into `run_dir` would write over an earlier run's checkpoints."""
    root = run_dir / "checkpoints"
    return any((root / name).is_file() for name in POINTERS) or bool(complete_checkpoints(run_dir))


def find_damage(checkpoint: Path) -> str | None:
    """Why a finished checkpoint cannot be resumed from (a file missing, cut short or unreadable), or None."""
    for name in _READERS:
        try:
            _parsed(checkpoint / name)
        except FacetrainError as error:
            return str(error)
    return find_data_damage(checkpoint)


_READERS = {
    "meta.json": (json.loads, dict),
    "classes.json": (json.loads, list),
    "config.yaml": (parse_plain_yaml, dict),
}
MAX_SMALL_FILE_BYTES = 256 << 20
"""classes.json of millions of identities is tens of megabytes; no small file of facetrain's is more."""


def _parsed(path: Path):
    """The parsed contents of one of a checkpoint's small files: regular files only (a FIFO would
    hang the reader), within MAX_SMALL_FILE_BYTES, config.yaml as plain YAML without aliases."""
    parse, kind = _READERS[path.name]
    try:
        value = parse(read_regular_bytes(path, path.name, MAX_SMALL_FILE_BYTES).decode())
        problem = None if isinstance(value, kind) else f"not a {kind.__name__} of facetrain's"
        if problem is None and path.name == "meta.json":
            problem = meta_problem(value)
    except UnreadableInput as error:
        problem = error.reason
    except PlainYamlError as error:
        problem = f"not valid yaml{error.where()}: {error.problem}"
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
        problem = f"not valid {path.suffix[1:]}: {reason}"
    if problem is not None:
        raise FacetrainError(f"{path} is missing or unreadable ({problem})")
    return value


def meta_problem(meta: dict) -> str | None:
    """What in a meta.json no run of facetrain's writes, or None: its counters are whole numbers in
    range (a step of -5 divided by zero, "abc" was a TypeError, 4.5 trained to "9.5 steps")."""
    for key, least in META_COUNTS.items():
        if key not in meta or (key in META_OPTIONAL and meta[key] is None):
            if key == "step":
                return "it has no step"
            continue
        value = meta[key]
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_META_COUNT:
            return f"its {key} is {str(value)[:40]!r}, not a whole number from {least} to {MAX_META_COUNT}"
    accuracy = meta.get("best_accuracy")
    if accuracy is not None and (
        isinstance(accuracy, bool) or not isinstance(accuracy, int | float) or not 0 <= accuracy <= 1
    ):
        return f"its best_accuracy is {str(accuracy)[:40]!r}, not a number from 0 to 1"
    return None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from itself, a `last`/`best` pointer, a checkpoints dir or a run dir; a run
    without a `last` pointer (lost, or never written) resolves to its newest finished checkpoint. Only
    a finished checkpoint is ever taken: one whose files no run changes any more."""
    path = Path(path)
    if UNFINISHED_NAME.fullmatch(path.name):
        finished = path.with_name(path.name.split(".")[0])
        raise FacetrainError(
            f"{path} is a checkpoint a run is still writing or removing, whose files may change while "
            f"read; pass {finished} once it is there, or the run folder {path.parent.parent}"
        )
    for candidate in (path, path / "last", path / "checkpoints" / "last"):
        if candidate.name in POINTERS and candidate.exists() and not candidate.is_dir():
            target, problem = pointer_target(candidate)
            if target is not None and (target / ".metadata").is_file():
                return target
            raise FacetrainError(
                f"{candidate} {problem or f'points to {target.name}, which is missing or incomplete'}"
            )
        if (candidate / ".metadata").is_file() and (candidate / "meta.json").is_file():
            return candidate
    finished = complete_checkpoints(path.parent if path.name == "checkpoints" else path)
    if finished:
        return finished[-1]
    raise FacetrainError(
        f"no checkpoint at {path}: expected a checkpoint directory, a run directory or a pointer"
    )


def pointer_target(pointer: Path) -> tuple[Path | None, str]:
    """The checkpoint a `last`/`best` pointer names (a step_NNNNNNNN beside it), or None and what is
    wrong with the pointer: not a regular file (a FIFO would hang the reader), binary, another name."""
    try:
        text = read_regular_bytes(pointer, "pointer", MAX_POINTER_BYTES).decode("ascii").strip()
    except UnreadableInput as error:
        return None, f"is unreadable ({error.reason})"
    except UnicodeDecodeError:
        return None, "is not a pointer of facetrain's (it holds binary data)"
    if not STEP_NAME.fullmatch(text):
        return None, f"names {text[:40]!r}, not a step_NNNNNNNN checkpoint beside it"
    return pointer.parent / text, ""


def find_resume_point(run_dir: Path) -> tuple[Path | None, list[str]]:
    """What `--resume auto` resumes from, and notes on what it passed over and why: the `last` pointer's
    checkpoint, or the newest whole one before it when the pointer is missing or names a missing or
    damaged one. Step order, not file times, decides "newest", so a copied run directory resumes the same
    way. None when the run has no finished checkpoint; an error when none is whole (starting afresh would
    write over them)."""
    finished = complete_checkpoints(run_dir)
    pointer = run_dir / "checkpoints" / "last"
    notes: list[str] = []
    candidates = finished
    if pointer.exists():
        target, problem = pointer_target(pointer)
        if target is None:
            notes.append(f"{pointer} {problem}; taking the newest finished checkpoint")
        elif target not in finished:
            notes.append(f"{pointer} names {target.name}, which is missing or incomplete")
        if target is not None:
            candidates = [p for p in finished if p == target or p.name < target.name] or finished
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


def read_config_yaml(checkpoint: Path) -> dict:
    """The checkpoint's config.yaml as plain data; the run that saved it reads it back into its typed
    tree (`facetrain.train.run_config.checkpoint_config`), the checkpoint knows no config schema."""
    return _read(checkpoint, "config.yaml")


def _read(checkpoint: Path, name: str):
    """A checkpoint's small file, read as `find_damage` reads it: a damaged one is one line, the same
    whether training resumes from it, `--init` starts from it or `export` reads it; it offers the newest
    whole checkpoint before it."""
    try:
        return _parsed(checkpoint / name)
    except FacetrainError as error:
        earlier = [p for p in complete_checkpoints(checkpoint.parent.parent) if p.name < checkpoint.name]
        whole = [p for p in reversed(earlier) if find_damage(p) is None]
        offer = f"use the one before it, {whole[0]}" if whole else "use another checkpoint"
        raise FacetrainError(f"checkpoint {checkpoint} is damaged: {error}; {offer}") from None
