"""The export formats by name, each writing one file into the export directory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from facetrain.interop.onnx_format import ONNX_NAME, write_onnx
from facetrain.interop.safetensors_format import SAFETENSORS_NAME, write_safetensors
from facetrain.interop.torchscript_format import TORCHSCRIPT_NAME, write_torchscript
from facetrain.registry import Registry

FormatWriter = Callable[[nn.Module, Path, dict[str, Any]], dict[str, Any]]
DEFAULT_FORMATS = ("safetensors", "torchscript", "onnx")


@dataclass(frozen=True)
class ExportFormat:
    """A writer `(backbone, out_dir, card) -> the card's entry for the file`, and the file it writes."""

    filename: str
    write: FormatWriter

    def __call__(self, module: nn.Module, out_dir: Path, card: dict[str, Any]) -> dict[str, Any]:
        return self.write(module, out_dir, card)


EXPORT_FORMATS: Registry[dict[str, Any]] = Registry("export format")
EXPORT_FORMATS.register("safetensors")(ExportFormat(SAFETENSORS_NAME, write_safetensors))
EXPORT_FORMATS.register("torchscript")(ExportFormat(TORCHSCRIPT_NAME, write_torchscript))
EXPORT_FORMATS.register("onnx")(ExportFormat(ONNX_NAME, write_onnx))


def export_format(name: str) -> ExportFormat:
    return EXPORT_FORMATS.get(name)
