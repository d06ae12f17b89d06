"""A model file another process rewrites in place while facetrain reads it (#57, inputs: an `--init`, a
teacher, the input of eval, export or outliers): facetrain's own writers replace a file whole, but a
copy or a foreign writer overwrites it where it is, and the reader got a mix of old and new bytes,
loaded without a word. Now one line names the file and says to try again when its writer is done."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from facetrain.checkpoint import read_entries
from facetrain.checkpoint.names import BACKBONE
from facetrain.checkpoint.storage import SafeReader
from facetrain.errors import FacetrainError
from facetrain.export.exporter import export_loaded
from facetrain.interop import loading
from facetrain.interop.insightface_import import write_imported_checkpoint
from facetrain.interop.loading import load_model
from tests.support.small_models import EMBEDDING_SIZE, fresh_backbone, fresh_model, small_config

WRITTEN_EARLIER = 1_600_000_000  # seconds: the files were written before the load, not within its clock tick


def written_earlier(folder: Path) -> None:
    for path in folder.iterdir():
        os.utime(path, (WRITTEN_EARLIER, WRITTEN_EARLIER))


def rewrite_in_place(path: Path) -> None:
    """What a foreign writer does: the second half of the file's bytes overwritten where they are."""
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.seek(size // 2)
        handle.write(bytes(size - size // 2))


def assert_refused_naming(error: pytest.ExceptionInfo, path: Path) -> None:
    message = str(error.value)
    assert "\n" not in message and f"{path} changed while it was read" in message, message
    assert "when its writer is done" in message


@pytest.mark.parametrize("target", ["", "model.json", "model.safetensors"])  # the folder, its card, the file
def test_an_exported_model_rewritten_while_it_loads_is_one_line(tmp_path, monkeypatch, target):
    export_loaded(fresh_model(), tmp_path, formats=["safetensors"], progress=False)
    written_earlier(tmp_path)
    weights = tmp_path / "model.safetensors"
    read = loading.read_safetensors_into

    def rewritten_first(module, path, device):
        rewrite_in_place(weights)  # zeroes half the weights: it loaded, wrong, in silence
        return read(module, path, device)

    monkeypatch.setattr(loading, "read_safetensors_into", rewritten_first)
    with pytest.raises(FacetrainError) as refused:
        load_model(tmp_path / target if target else tmp_path)
    assert_refused_naming(refused, weights)


@pytest.mark.parametrize("reader", ["load_model", "read_entries"])
def test_a_checkpoint_rewritten_while_it_loads_is_one_line(tmp_path, monkeypatch, reader):
    """Through `load_model` (`--init`, the teacher, eval, export) and the tensor reads beneath every
    checkpoint read (the head of export and outliers, a resume)."""
    config = small_config()
    state = fresh_backbone(config).state_dict()
    checkpoint = tmp_path / "checkpoint"
    write_imported_checkpoint(
        {BACKBONE + key: value for key, value in state.items()},
        {"embedding_size": EMBEDDING_SIZE},
        config,
        [],
        checkpoint,
    )
    written_earlier(checkpoint)
    (data,) = checkpoint.glob("*.distcp")
    read_data = SafeReader.read_data

    def rewritten_first(self, plan, planner):
        rewrite_in_place(data)
        return read_data(self, plan, planner)

    monkeypatch.setattr(SafeReader, "read_data", rewritten_first)
    with pytest.raises(FacetrainError) as refused:
        if reader == "load_model":
            load_model(checkpoint)
        else:
            read_entries(checkpoint, [BACKBONE + next(iter(state))])
    assert_refused_naming(refused, data)
