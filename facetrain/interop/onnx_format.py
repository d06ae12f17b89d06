"""The backbone as ONNX with a dynamic batch axis, checked with onnxruntime before it is kept.

onnx and onnxruntime are optional (`pip install 'facetrain[onnx]'`) and imported only here, so the
other formats work without them. The TorchScript-based exporter is used because it needs nothing
beyond torch; the new torch.export-based one needs onnxscript.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.files import atomic_target
from facetrain.interop.card import card_image_size
from facetrain.interop.parity import check_outputs, example_batch

ONNX_NAME = "model.onnx"
OPSET = 17
INPUT_NAME = "images"
OUTPUT_NAME = "embeddings"


def require(module_name: str) -> ModuleType:
    """Import an optional ONNX package, or say how to install it in one line."""
    try:
        return importlib.import_module(module_name)
    except ImportError:
        raise FacetrainError(
            f"ONNX export needs {module_name}: pip install 'facetrain[onnx]', "
            "or pass --formats safetensors,torchscript"
        ) from None


def write_onnx(module: nn.Module, out_dir: Path, card: dict[str, Any]) -> dict[str, Any]:
    """Export, validate the graph, and compare onnxruntime's output with PyTorch's."""
    onnx = require("onnx")
    onnxruntime = require("onnxruntime")
    path = out_dir / ONNX_NAME
    image_size = card_image_size(card, path)
    with atomic_target(path) as tmp:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", category=DeprecationWarning)
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            # an instance norm (IBN-a) always normalises by its input's statistics, which the exporter
            # reports as "train=True" in an eval export: true, expected, and not the user's to fix
            warnings.filterwarnings("ignore", message=".*'instance_norm' is set to train=True")
            torch.onnx.export(
                module,
                (example_batch(image_size),),
                str(tmp),
                dynamo=False,
                opset_version=OPSET,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            )
        onnx.checker.check_model(str(tmp))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        session = onnxruntime.InferenceSession(str(tmp), options, providers=["CPUExecutionProvider"])

        def run(images: torch.Tensor) -> np.ndarray:
            return session.run([OUTPUT_NAME], {INPUT_NAME: images.numpy()})[0]

        max_diff = check_outputs(module, run, image_size, "ONNX")
    return {
        "file": ONNX_NAME,
        "opset": OPSET,
        "input": INPUT_NAME,
        "output": OUTPUT_NAME,
        "max_abs_diff": max_diff,
    }
