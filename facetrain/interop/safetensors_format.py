"""Backbone weights as safetensors: the canonical export, loadable without unpickling anything.

The file holds only tensors; the architecture is rebuilt from the card's config, so loading can never
run code hidden in the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as load_safetensors_model
from safetensors.torch import save_file
from safetensors.torch import save_model as save_safetensors_model
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.files import atomic_target

SAFETENSORS_NAME = "model.safetensors"
HEAD_NAME = "head.safetensors"


def write_safetensors(module: nn.Module, out_dir: Path, card: dict[str, Any]) -> dict[str, Any]:
    """Write the backbone's parameters and buffers; returns the card's entry for the file."""
    path = out_dir / SAFETENSORS_NAME
    metadata = {"architecture": str(card["architecture"]), "embedding_size": str(card["embedding_size"])}
    with atomic_target(path) as tmp, _os_errors():
        save_safetensors_model(module, str(tmp), metadata=metadata, force_contiguous=True)
    return {"file": SAFETENSORS_NAME, "tensors": len(module.state_dict())}


def read_safetensors_into(module: nn.Module, path: Path, device: torch.device | str = "cpu") -> nn.Module:
    """Load `path` into `module`, which must have exactly the file's tensors."""
    try:
        load_safetensors_model(module, str(path), strict=True, device=str(device))
    except FileNotFoundError:
        raise FacetrainError(f"model weights {path} do not exist") from None
    except (SafetensorError, OSError) as error:
        raise FacetrainError(f"{path} is not a readable safetensors file: {error}") from None
    except RuntimeError as error:
        first_line = str(error).strip().splitlines()[0]
        raise FacetrainError(f"{path} does not match the architecture in its card: {first_line}") from None
    return module


def write_head(weight: torch.Tensor, out_dir: Path, metadata: dict[str, str]) -> dict[str, Any]:
    """Write the full head weight gathered from its shards: classes x embedding, or classes x
    sub-centers x embedding."""
    path = out_dir / HEAD_NAME
    with atomic_target(path) as tmp, _os_errors():
        save_file({"weight": weight.detach().to("cpu").contiguous()}, str(tmp), metadata=metadata)
    return {"file": HEAD_NAME, "num_classes": int(weight.shape[0]), "embedding_size": int(weight.shape[-1])}


@contextmanager
def _os_errors() -> Iterator[None]:
    """safetensors reports a failed write as a SafetensorError carrying "(os error N)"; raise it as
    the OSError it is, so a full disk is told like any other."""
    try:
        yield
    except SafetensorError as error:
        code = re.search(r"\(os error (\d+)\)", str(error))
        if code is None:
            raise
        raise OSError(int(code.group(1)), os.strerror(int(code.group(1)))) from None
