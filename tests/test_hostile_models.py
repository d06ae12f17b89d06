"""Model files that are programs (#38, high item 1): a TorchScript archive whose `forward` writes to a
file of the user's must not run unless the user asked for TorchScript to be trusted."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch import nn

from facetrain.interop.card import CARD_NAME, card_json
from tests.support.hostile_helpers import one_line_error
from tests.support.small_models import fresh_model

VICTIM_TEXT = b"untouched victim file\n"


class Overwriter(nn.Module):
    """Embeds by flattening the image, and on the way fills the first bytes of `target` with 'X'."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        written = torch.from_file(self.target, shared=True, size=8, dtype=torch.uint8).fill_(88)
        return images.flatten(1)[:, :8] + 0 * written.float()  # used, so the compiler keeps the write


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM_TEXT)
    return path


def evil_torchscript(path: Path, victim: Path) -> Path:
    """A TorchScript file carrying a valid card, so a loader that trusts it goes on to run `forward`."""
    card = fresh_model().card
    torch.jit.save(
        torch.jit.script(Overwriter(str(victim))), str(path), _extra_files={CARD_NAME: card_json(card)}
    )
    return path


def two_images(folder: Path) -> list[Path]:
    folder.mkdir()
    paths = [folder / "a.png", folder / "b.png"]
    for seed, path in enumerate(paths):
        cv2.imwrite(str(path), np.random.default_rng(seed).integers(0, 256, (20, 20, 3), dtype=np.uint8))
    return paths


def test_embed_refuses_a_torchscript_file_without_the_trust_flag(tmp_path: Path, victim: Path) -> None:
    model = evil_torchscript(tmp_path / "evil.pt", victim)
    two_images(tmp_path / "faces")
    out = tmp_path / "e.npy"
    line = one_line_error("embed", model, tmp_path / "faces", "-o", out, "--device", "cpu")
    assert line.startswith(f"error: {model} is TorchScript, a program that runs when it is loaded;")
    assert "--trust-torchscript" in line
    assert victim.read_bytes() == VICTIM_TEXT
    assert not out.exists()


def test_compare_refuses_an_export_holding_only_torchscript(tmp_path: Path, victim: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    evil_torchscript(export / "model.torchscript.pt", victim)
    card = {**fresh_model().card, "files": {"torchscript": {"file": "model.torchscript.pt"}}}
    (export / CARD_NAME).write_text(json.dumps(card))
    first, second = two_images(tmp_path / "faces")
    line = one_line_error("compare", export, first, second, "--device", "cpu")
    assert line.startswith(f"error: {export / 'model.torchscript.pt'} is TorchScript")
    assert victim.read_bytes() == VICTIM_TEXT


def test_the_trust_flag_runs_the_program_as_it_says(tmp_path: Path, victim: Path) -> None:
    """What --trust-torchscript's help warns of: the file's own code runs."""
    from click.testing import CliRunner

    from facetrain.cli import main

    model = evil_torchscript(tmp_path / "evil.pt", victim)
    first, second = two_images(tmp_path / "faces")
    args = ["compare", model, first, second, "--device", "cpu", "--trust-torchscript", "--no-flip"]
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    assert result.exit_code == 0, result.output
    assert victim.read_bytes().startswith(b"XXXXXXXX")
