"""Importing dlib's face recognition network (`dlib_face_recognition_resnet_model_v1.dat`) as a checkpoint.

The file is decoded by `facetrain.interop.dlib_format` (pure Python, nothing executed, no dlib call);
its layer sequence is checked against `dlib_resnet`'s, layer kind by kind and setting by setting
(strides, paddings, pool windows, shapes), and the first difference is reported in one line before
anything is written. The checkpoint is written exactly as `facetrain import insightface` writes one,
so `eval`, `export`, `embed`, `compare` and `train --init` take it. Its `meta.json` records the file
and dlib's own input convention (150x150 RGB chips, (pixel - mean) / 256), which the backbone's
`input` layer applies to facetrain's normalised pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from facetrain.align.dlib_models import model_file
from facetrain.errors import FacetrainError
from facetrain.interop.dlib_format import DlibLayer, DlibNetwork, read_dlib_network
from facetrain.interop.imported_config import ImportedConfig, backbone_config
from facetrain.interop.insightface_import import (
    ImportResult,
    check_destination,
    file_sha256,
    write_backbone_checkpoint,
)
from facetrain.models import Backbone, build_backbone
from facetrain.models.dlib_resnet import DLIB_PIXEL_SCALE, dlib_layer_sequence
from facetrain.progress import ProgressBar

ARCHITECTURE = "dlib_resnet"
DLIB_MODEL_FILE = "dlib_face_recognition_resnet_model_v1.dat"
SOURCE_FORMAT = "dlib DNN (loss_metric network, dlib::serialize)"


def default_dlib_model() -> Path:
    """The network file that `face-recognition-models` installs."""
    return model_file(DLIB_MODEL_FILE)


def import_dlib(
    source: str | Path | None, out_dir: str | Path, overwrite: bool = False, progress: bool = True
) -> ImportResult:
    """Check dlib's network file `source` (None: the installed one) and write it as a checkpoint."""
    source = default_dlib_model() if source is None else Path(source)
    out_dir = Path(out_dir)
    check_destination(out_dir, overwrite)
    with ProgressBar(total=3, desc="import", unit="step", disable=not progress) as bar:
        bar.set_postfix_str("read")
        network = read_dlib_network(source)
        bar.update()
        bar.set_postfix_str("check")
        backbone = dlib_backbone(network, source)
        bar.update()
        bar.set_postfix_str("write")
        meta = {
            "format": SOURCE_FORMAT,
            "architecture": ARCHITECTURE,
            "file": str(source.resolve()),
            "sha256": file_sha256(source),
            "input": dlib_input_convention(network),
            "loss": {"name": network.loss, **network.loss_settings},
        }
        config = dlib_config(backbone.embedding_size, network.input_size)
        write_backbone_checkpoint(backbone, config, out_dir, meta)
        bar.update()
    return ImportResult(out_dir, ARCHITECTURE, backbone.embedding_size, len(backbone.state_dict()))


def dlib_backbone(network: DlibNetwork, path: Path) -> Backbone:
    """`dlib_resnet` holding the network's weights, after checking every layer against it."""
    fc = network.layers[-1] if network.layers else None
    if fc is None or fc.kind != "fc":
        raise FacetrainError(
            f"{path}: the network does not end in an fc layer, so it is not dlib's face ResNet"
        )
    config = dlib_config(int(fc.settings["outputs"]), network.input_size)
    backbone = build_backbone(config.model, network.input_size)
    expected = dlib_layer_sequence(backbone)
    found = [layer.kind for layer in network.layers]
    if found != [kind for kind, _ in expected]:
        raise FacetrainError(f"{path}: {_first_difference(found, [kind for kind, _ in expected])}")
    with torch.no_grad():
        for index, ((kind, module), layer) in enumerate(zip(expected, network.layers)):
            loader = LOADERS.get(kind)
            if loader is not None:
                problem = loader(module, layer)
                if problem:
                    raise FacetrainError(f"{path}: layer {index} ({kind}): {problem}; not dlib's face ResNet")
        backbone.get_submodule("input").mean.copy_(torch.tensor(network.input_mean))
    return backbone.eval()


def dlib_config(embedding_size: int, input_size: tuple[int, int]) -> ImportedConfig:
    """The config an imported dlib network is rebuilt from: its chip size, no dropout."""
    return backbone_config(ARCHITECTURE, embedding_size, input_size)


def dlib_input_convention(network: DlibNetwork) -> dict:
    """How dlib feeds the network, recorded for users who call it outside facetrain."""
    mean = [float(value) for value in network.input_mean]
    return {
        "layer": network.input_kind,
        "size": list(network.input_size),
        "channels": "RGB",
        "mean": mean,
        "scale": DLIB_PIXEL_SCALE,
        "formula": f"(pixel - mean) / {DLIB_PIXEL_SCALE:g} on 0-255 RGB values, per-channel mean above",
        "in_facetrain": "the backbone's `input` layer applies it to facetrain's (pixel - 127.5) / 127.5",
        "l2_normalized": False,
    }


def _first_difference(found: list[str], expected: list[str]) -> str:
    for index, (theirs, ours) in enumerate(zip(found, expected)):
        if theirs != ours:
            return f"layer {index} is {theirs!r} where dlib's face ResNet has {ours!r}"
    return f"the file has {len(found)} layers where dlib's face ResNet has {len(expected)}"


def _copy(target: torch.Tensor, values: np.ndarray, name: str) -> str | None:
    if tuple(values.shape) != tuple(target.shape):
        return f"{name} has shape {tuple(values.shape)}, expected {tuple(target.shape)}"
    target.copy_(torch.from_numpy(np.ascontiguousarray(values)))
    return None


def _load_con(module: nn.Conv2d, layer: DlibLayer) -> str | None:
    stride = (layer.settings["stride_y"], layer.settings["stride_x"])
    padding = (layer.settings["padding_y"], layer.settings["padding_x"])
    if stride != module.stride or padding != module.padding:
        return f"stride {stride} and padding {padding}, expected {module.stride} and {module.padding}"
    return _copy(module.weight, layer.arrays["weight"], "weight") or _copy(
        module.bias, layer.arrays["bias"], "bias"
    )


def _load_affine(module: nn.Module, layer: DlibLayer) -> str | None:
    if layer.settings["mode"] != 0:
        return "an affine layer in fc mode, expected conv mode (one scale per channel)"
    return _copy(module.weight, layer.arrays["gamma"], "gamma") or _copy(
        module.bias, layer.arrays["beta"], "beta"
    )


def _check_pool(module: nn.Module, layer: DlibLayer) -> str | None:
    window = (layer.settings["rows"], layer.settings["cols"])
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return None if window == (0, 0) else f"a {window} window, expected pooling over everything"
    stride = (layer.settings["stride_y"], layer.settings["stride_x"])
    padding = (layer.settings["padding_y"], layer.settings["padding_x"])
    ours = tuple(_pair(getattr(module, name)) for name in ("kernel_size", "stride", "padding"))
    if (window, stride, padding) != ours:
        return f"window, stride, padding {(window, stride, padding)}, expected {ours}"
    return None


def _load_fc(module: nn.Linear, layer: DlibLayer) -> str | None:
    if "bias" in layer.arrays:
        return "an fc layer with a bias, expected fc_no_bias"
    return _copy(module.weight, layer.arrays["weight"].T, "weight")


def _pair(value: int | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


LOADERS: dict[str, Callable[[nn.Module, DlibLayer], str | None]] = {
    "con": _load_con,
    "affine": _load_affine,
    "max_pool": _check_pool,
    "avg_pool": _check_pool,
    "fc": _load_fc,
}
