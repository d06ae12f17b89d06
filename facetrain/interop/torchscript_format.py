"""The backbone as a traced TorchScript file, runnable from C++ or Python without facetrain.

The card travels inside the archive as an extra file, so a lone `.pt` still knows its input size and
threshold. PyTorch marks TorchScript deprecated in favour of torch.export; its warnings are silenced
here because the format is what deployments ask for, and the round-trip check guards its output.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.files import atomic_target
from facetrain.interop.card import CARD_NAME, card_image_size, card_json
from facetrain.interop.parity import check_outputs, example_batch

TORCHSCRIPT_NAME = "model.torchscript.pt"


@contextmanager
def _quiet_torchscript() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.jit.*deprecated")
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        yield


def write_torchscript(module: nn.Module, out_dir: Path, card: dict[str, Any]) -> dict[str, Any]:
    """Trace (unless already scripted), save with the card embedded, reload and check it."""
    path = out_dir / TORCHSCRIPT_NAME
    image_size = card_image_size(card, path)
    with atomic_target(path) as tmp:
        with _quiet_torchscript(), torch.inference_mode(False), torch.no_grad():
            traced = (
                module
                if isinstance(module, torch.jit.ScriptModule)
                else torch.jit.trace(module, example_batch(image_size), check_trace=False)
            )
            archive = io.BytesIO()  # on a full disk, torch.jit.save to a file aborts the process in C++
            torch.jit.save(traced, archive, _extra_files={CARD_NAME: card_json(card)})
            tmp.write_bytes(archive.getvalue())
            reloaded = torch.jit.load(str(tmp), map_location="cpu")
        max_diff = check_outputs(module, reloaded, image_size, "TorchScript")
    return {"file": TORCHSCRIPT_NAME, "max_abs_diff": max_diff}


def read_torchscript(path: Path, device: torch.device | str = "cpu") -> tuple[nn.Module, str]:
    """The scripted module and its embedded card text ('' when the file carries none)."""
    extra = {CARD_NAME: ""}
    try:
        with _quiet_torchscript():
            module = torch.jit.load(str(path), map_location=device, _extra_files=extra)
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0]
        raise FacetrainError(f"{path} is not a TorchScript model: {first_line}") from None
    card_text = extra[CARD_NAME]
    return module.eval(), card_text.decode() if isinstance(card_text, bytes) else card_text
