"""Hostile YAML and non-regular files where facetrain reads a config (#38): alias bombs (high item 4)
and named pipes (high item 5) in `-c`, `--set` and a checkpoint's config.yaml, and the medium cases
of deep nesting, other encodings and endless numbers. Each is one line, quickly, with nothing written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from facetrain.checkpoint import find_resume_point
from facetrain.checkpoint.layout import pointer_target, resolve_checkpoint
from facetrain.errors import FacetrainError
from facetrain.train.run_config import checkpoint_config
from tests.support.hostile_helpers import fake_checkpoint, one_line_error

ALIASES_REFUSED = "aliases (*name) are not read, so that a small file cannot expand to gigabytes"


def alias_bomb(levels: int) -> str:
    """A few hundred bytes that safe_load expands to 9**levels strings, where a number belongs."""
    anchors = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    anchors += [f"&a{level} [{', '.join([f'*a{level - 1}'] * 9)}]" for level in range(1, levels + 1)]
    return "train:\n  steps: [" + ", ".join(anchors) + "]\n"


@pytest.mark.timeout(20)
def test_an_alias_bomb_config_is_refused_at_its_first_alias(tmp_path: Path) -> None:
    """Before: expanded, and the type error printed all 9**5 strings (7 levels: 11 s and 1.4 GB)."""
    config = tmp_path / "bomb.yaml"
    config.write_text(alias_bomb(5))
    line = one_line_error("config", "-c", config)
    assert (
        line
        == f"error: config {config} line 2: not valid YAML: {ALIASES_REFUSED}; write the value out in full"
    )


@pytest.mark.timeout(20)
def test_an_alias_bomb_in_set_is_refused(tmp_path: Path) -> None:
    value = "[&a [1,1,1,1,1,1,1,1,1], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], [*b,*b,*b,*b,*b,*b,*b,*b,*b]]"
    line = one_line_error("config", "--set", f"train.steps={value}")
    assert line.startswith("error: --set 'train.steps=[&a [1,1,1,1")
    assert line.endswith(f"the value is not valid YAML: {ALIASES_REFUSED}; write the value out in full")


@pytest.mark.timeout(20)
def test_an_alias_bomb_in_a_checkpoints_config_is_damage(tmp_path: Path) -> None:
    checkpoint = fake_checkpoint(tmp_path / "run", alias_bomb(5))
    with pytest.raises(FacetrainError) as error:
        checkpoint_config(checkpoint)
    message = str(error.value)
    assert message.startswith(f"checkpoint {checkpoint} is damaged: {checkpoint / 'config.yaml'} is missing")
    assert f"(not valid yaml line 2: {ALIASES_REFUSED}" in message and len(message) < 600


def test_a_huge_value_is_cut_in_the_message(tmp_path: Path) -> None:
    """No alias, just a long list where a number belongs: the message shows its first items."""
    config = tmp_path / "long.yaml"
    config.write_text("train:\n  steps: [" + ", ".join(["123456789"] * 100_000) + "]\n")
    line = one_line_error("config", "-c", config)
    assert line.startswith(f"error: config {config}: train.steps must be an integer, got [123456789, ")
    assert len(line) < 400


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "train: " + "[" * 20000 + "]" * 20000 + "\n",
            "line 1: not valid YAML: nested more than 64 levels deep",
        ),
        (
            "train: " + "{k: " * 5000 + "1" + "}" * 5000 + "\n",
            "nested more than 64",
        ),
        (
            "train: {steps: " + "9" * 5001 + "}\n",
            "not valid YAML: a value cannot be converted (Exceeds the limit",
        ),
    ],
    ids=["20000-deep list", "5000-deep map", "5001-digit integer"],
)
def test_deep_or_endless_yaml_is_one_line(tmp_path: Path, text: str, problem: str) -> None:
    config = tmp_path / "deep.yaml"
    config.write_text(text)
    assert problem in one_line_error("config", "-c", config)


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_a_config_in_another_encoding_says_to_save_it_as_utf8(tmp_path: Path, encoding: str) -> None:
    config = tmp_path / "other.yaml"
    config.write_bytes("# café\ntrain: {steps: 3}\n".encode(encoding))
    line = one_line_error("config", "-c", config)
    assert line.startswith(f"error: config {config}: not UTF-8 text (byte ")
    assert line.endswith("; save it as UTF-8")


def test_a_utf8_config_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    from facetrain.train.run_config import load_config

    config = tmp_path / "bom.yaml"
    config.write_bytes("\ufefftrain: {steps: 3}\n".encode())
    assert load_config(config).train.steps == 3


@pytest.mark.timeout(20)
def test_a_named_pipe_as_config_is_one_line(tmp_path: Path) -> None:
    """Before, `open()` waited for a writer forever."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert one_line_error("config", "-c", fifo) == (
        f"error: config {fifo} is a named pipe, not a file; pass the file itself"
    )


@pytest.mark.timeout(20)
def test_resume_passes_over_a_checkpoint_whose_config_is_a_named_pipe(tmp_path: Path) -> None:
    checkpoint = fake_checkpoint(tmp_path / "run", None)
    with pytest.raises(FacetrainError) as error:
        find_resume_point(tmp_path / "run")
    assert str(error.value) == (
        f"no whole checkpoint to resume in {tmp_path / 'run' / 'checkpoints'} (skipping damaged checkpoint "
        f"{checkpoint.name}: {checkpoint / 'config.yaml'} is missing or unreadable (a named pipe, not a file)); "
        "remove the damaged ones to start afresh, or choose another train.output_dir"
    )


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "pointer, problem",
    [
        ("fifo", "is unreadable (a named pipe, not a file)"),
        ("binary", "is not a pointer of facetrain's (it holds binary data)"),
        ("elsewhere", "names '../../../etc', not a step_NNNNNNNN checkpoint beside it"),
    ],
)
def test_a_last_pointer_that_names_no_checkpoint_is_one_line(
    tmp_path: Path, pointer: str, problem: str
) -> None:
    """Before: a FIFO hung `--resume auto`, binary bytes were a UnicodeDecodeError traceback."""
    fake_checkpoint(tmp_path / "run", "train: {steps: 3}\n")
    last = tmp_path / "run" / "checkpoints" / "last"
    last.unlink()
    if pointer == "fifo":
        os.mkfifo(last)
    else:
        last.write_bytes(b"\xff\xfe\x00step" if pointer == "binary" else b"../../../etc")
    assert pointer_target(last) == (None, problem)
    with pytest.raises(FacetrainError, match="^" + re.escape(f"{last} {problem}") + "$"):
        resolve_checkpoint(last)


def test_an_unknown_section_from_set_is_blamed_on_set() -> None:
    """Low item: the error named the config file, which holds no such key."""
    assert one_line_error("config", "--set", "nosuch.key=1").startswith("error: --set: unknown key nosuch;")


def test_an_infinite_margin_is_refused_before_training() -> None:
    """Low item: it passed validation and failed at step 1 with advice about the learning rate."""
    line = one_line_error("config", "--set", "head.margin_params={m: .inf}")
    assert line == "error: --set: head.margin_params = {'m': inf}: m must be a finite number"
