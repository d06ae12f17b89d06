"""dlib's serialized DNNs (`net_type` written with `dlib::serialize`), read in pure Python.

Nothing in the file is executed and dlib is not needed: the bytes are decoded as dlib's
`serialize.h` writes them. Integers are a control byte (low nibble: byte count, 0x80: negative)
followed by that many little-endian bytes; strings are a length and their bytes; bools are the
characters '0' and '1'; a float is an integer mantissa and exponent, mantissa * 2**exponent.

A network is written from the loss layer down. Each `add_layer` writes its version, then its whole
subnetwork, then its own layer details and cached state, so the version numbers of every wrapper
come first (top down), then the input layer, then each layer's details (bottom up). Tag and skip
layers write only a version and their subnetwork, and `add_prev_` does not name its tag: the graph's
wiring lives in dlib's C++ types, not in the file. The reader therefore returns the layers in
order, with a `mark` wherever a tag or skip layer stood, and leaves the wiring to the PyTorch model
that mirrors the C++ definition and checks this sequence against its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from facetrain.errors import FacetrainError
from facetrain.input_files import read_regular_bytes

TAG_OR_SKIP = "mark"
INPUT_PREFIX = b"input_"
LOSS_METRIC = "loss_metric_2"
# The float_details exponents that stand for infinities and NaN.
SPECIAL_EXPONENTS = {32000: np.inf, 32001: -np.inf, 32002: np.nan}
LAYER_VERSIONS = (1, 2)  # add_layer over a subnetwork; 2 adds params_grad
INPUT_LAYER_VERSIONS = (2, 3)  # add_layer over the input layer; 3 adds the sample expansion factor
TAG_VERSION = 1
MAX_FILE_BYTES = 256 << 20
"""dlib's face ResNet is 22.5 MB (5.6 M parameters as raw float32s); ten times that covers a bigger
network of the same kind, even in the longer mantissa/exponent form, and refuses /dev/zero-like input."""


@dataclass
class DlibLayer:
    """One layer's details: `kind` is dlib's class name without the trailing underscore."""

    kind: str
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    settings: dict[str, float | int] = field(default_factory=dict)


@dataclass
class DlibNetwork:
    loss: str
    loss_settings: dict[str, float]
    input_kind: str
    input_mean: tuple[float, float, float]
    input_size: tuple[int, int]
    layers: list[DlibLayer]
    """Bottom up from the input, with `TAG_OR_SKIP` marks where tag and skip layers stand."""


class _Reader:
    def __init__(self, data: bytes, path: Path):
        self.data = data
        self.pos = 0
        self.path = path

    def fail(self, what: str) -> FacetrainError:
        return FacetrainError(
            f"{self.path}: byte {self.pos}: {what}; this is not a dlib DNN file facetrain can read "
            "(expected dlib_face_recognition_resnet_model_v1.dat from face-recognition-models)"
        )

    def take(self, count: int) -> bytes:
        if count < 0 or self.pos + count > len(self.data):
            raise self.fail(f"the file ends inside a value of {count} bytes")
        chunk = self.data[self.pos : self.pos + count]
        self.pos += count
        return chunk

    def integer(self) -> int:
        control = self.take(1)[0]
        size = control & 0x0F
        if size > 8 or control & 0x70:
            raise self.fail(f"control byte {control:#04x} is not a dlib integer")
        value = int.from_bytes(self.take(size), "little") if size else 0
        return -value if control & 0x80 else value

    def floating(self) -> float:
        mantissa, exponent = self.integer(), self.integer()
        if exponent in SPECIAL_EXPONENTS:
            return float(SPECIAL_EXPONENTS[exponent])
        try:
            return math.ldexp(float(mantissa), exponent)
        except OverflowError:
            raise self.fail(f"a float of exponent {exponent} is out of range") from None

    def string(self) -> str:
        length = self.integer()
        try:
            return self.take(length).decode("ascii")
        except UnicodeDecodeError:
            raise self.fail("a layer name is not ASCII") from None

    def boolean(self) -> bool:
        value = self.take(1)
        if value not in (b"0", b"1"):
            raise self.fail(f"{value!r} is not a dlib bool")
        return value == b"1"

    def tensor(self) -> np.ndarray:
        """A resizable_tensor (N, K, rows, cols): version 2 stores raw little-endian float32s,
        version 1 one mantissa/exponent pair per value."""
        version = self.integer()
        shape = tuple(self.integer() for _ in range(4))
        if min(shape) < 0:
            raise self.fail(f"tensor shape {shape} is negative")
        count = math.prod(shape)  # Python's integers: a hostile shape cannot wrap around as int64 does
        smallest = {2: 4, 1: 2}.get(version, 0)  # bytes a value takes at least: a float32, two integers
        if smallest * count > len(self.data) - self.pos:
            raise self.fail(f"tensor shape {shape} holds more values than the file has bytes left")
        if version == 2:
            values = np.frombuffer(self.take(4 * count), dtype="<f4").astype(np.float32)
        elif version == 1:
            values = np.array([self.floating() for _ in range(count)], dtype=np.float32)
        else:
            raise self.fail(f"tensor version {version} is unknown")
        return values.reshape(shape)

    def alias_tensor(self) -> tuple[int, int, int, int]:
        if self.integer() != 1:
            raise self.fail("unknown alias_tensor version")
        shape = tuple(self.integer() for _ in range(4))
        if min(shape) < 0:
            raise self.fail(f"alias_tensor shape {shape} is negative")
        return shape

    def starts_input_layer(self) -> bool:
        """Whether a string naming an input layer (`input_...`) comes next."""
        saved = self.pos
        try:
            length = self.integer()
            return 0 < length < 64 and self.data[self.pos : self.pos + len(INPUT_PREFIX)] == INPUT_PREFIX
        except FacetrainError:
            return False
        finally:
            self.pos = saved


def read_dlib_network(path: str | Path) -> DlibNetwork:
    """The layers of a dlib `loss_metric` network file, bottom up, with their parameters."""
    path = Path(path)
    data = read_regular_bytes(path, "dlib model", MAX_FILE_BYTES)
    reader = _Reader(data, path)
    if reader.integer() != 1:
        raise reader.fail("no add_loss_layer version 1 at the start")
    loss = reader.string()
    if loss != LOSS_METRIC:
        raise reader.fail(f"loss layer {loss!r} is not dlib's metric loss ({LOSS_METRIC})")
    loss_settings = {"margin": reader.floating(), "distance_threshold": reader.floating()}
    wrappers = _wrapper_versions(reader)
    input_kind, mean, size = _input_layer(reader)
    layers = [_details(reader)]
    _input_layer_state(reader, wrappers[-1])
    for version in reversed(wrappers[:-1]):
        if version == TAG_VERSION:
            layers.append(DlibLayer(TAG_OR_SKIP))
        else:
            layers.append(_details(reader))
            _layer_state(reader, version)
    if reader.pos != len(data):
        raise reader.fail(f"{len(data) - reader.pos} bytes follow the network")
    return DlibNetwork(LOSS_METRIC, loss_settings, input_kind, mean, size, layers)


def _wrapper_versions(reader: _Reader) -> list[int]:
    """The versions of the wrappers from the loss layer's subnetwork down to the input layer.

    A 1 is a tag or skip layer (or an add_layer of dlib's first format, which only wrote version 1
    files before tags existed in saved networks); 2 is an add_layer. The last one wraps the input.
    """
    versions = []
    while True:
        version = reader.integer()
        versions.append(version)
        if reader.starts_input_layer():
            if version not in INPUT_LAYER_VERSIONS:
                raise reader.fail(f"input add_layer version {version} is unknown")
            return versions
        if version not in LAYER_VERSIONS:
            raise reader.fail(f"layer version {version} is unknown")


def _input_layer(reader: _Reader) -> tuple[str, tuple[float, float, float], tuple[int, int]]:
    kind = reader.string()
    if kind != "input_rgb_image_sized":
        raise reader.fail(f"input layer {kind!r} is not input_rgb_image_sized")
    mean = (reader.floating(), reader.floating(), reader.floating())
    rows, cols = reader.integer(), reader.integer()
    return kind, mean, (rows, cols)


def _input_layer_state(reader: _Reader, version: int) -> None:
    """Skip the add_layer state after the first layer's details: flags and cached tensors."""
    for _ in range(3):
        reader.boolean()
    for _ in range(3):  # x_grad, cached_output, grad_final
        reader.tensor()
    if version == 3:
        reader.integer()


def _layer_state(reader: _Reader, version: int) -> None:
    for _ in range(3):
        reader.boolean()
    for _ in range(3 if version == 2 else 2):  # x_grad, cached_output (, params_grad)
        reader.tensor()


def _details(reader: _Reader) -> DlibLayer:
    kind = reader.string()
    parse = _DETAILS.get(kind)
    if parse is None:
        raise reader.fail(f"layer {kind!r} is not one facetrain reads ({', '.join(sorted(_DETAILS))})")
    return parse(reader)


def _con(reader: _Reader) -> DlibLayer:
    params = reader.tensor().reshape(-1)
    filters, rows, cols = reader.integer(), reader.integer(), reader.integer()
    stride = (reader.integer(), reader.integer())
    padding = (reader.integer(), reader.integer())
    weight_shape = reader.alias_tensor()
    bias_shape = reader.alias_tensor()
    for _ in range(4):  # learning-rate and weight-decay multipliers
        reader.floating()
    weight_size = math.prod(weight_shape)
    if weight_shape[0] != filters or weight_shape[2:] != (rows, cols) or params.size != weight_size + filters:
        raise reader.fail(f"con_ of {filters} {rows}x{cols} filters holds {params.size} parameters")
    del bias_shape
    return DlibLayer(
        "con",
        {"weight": params[:weight_size].reshape(weight_shape), "bias": params[weight_size:]},
        {"stride_y": stride[0], "stride_x": stride[1], "padding_y": padding[0], "padding_x": padding[1]},
    )


def _affine(reader: _Reader) -> DlibLayer:
    params = reader.tensor().reshape(-1)
    gamma_shape = reader.alias_tensor()
    reader.alias_tensor()
    mode = reader.integer()
    channels = math.prod(gamma_shape)
    if params.size != 2 * channels:
        raise reader.fail(f"affine_ of {channels} channels holds {params.size} parameters")
    return DlibLayer("affine", {"gamma": params[:channels], "beta": params[channels:]}, {"mode": mode})


def _batch_norm(reader: _Reader) -> DlibLayer:
    """A bn_con layer in inference form: dlib itself turns it into an affine_ when loading one."""
    params = reader.tensor().reshape(-1)
    reader.alias_tensor()
    reader.alias_tensor()
    reader.tensor()  # means
    reader.tensor()  # invstds
    running_mean = reader.tensor().reshape(-1).astype(np.float64)
    running_variance = reader.tensor().reshape(-1).astype(np.float64)
    reader.integer()  # num_updates
    reader.integer()  # running_stats_window_size
    for _ in range(4):
        reader.floating()
    eps = reader.floating()
    channels = running_mean.size
    if params.size != 2 * channels or running_variance.size != channels:
        raise reader.fail(
            f"bn_con of {channels} channels holds {params.size} parameters and {running_variance.size} variances"
        )
    gamma = params[:channels].astype(np.float64) / np.sqrt(running_variance + eps)
    beta = params[channels:].astype(np.float64) - gamma * running_mean
    return DlibLayer(
        "affine", {"gamma": gamma.astype(np.float32), "beta": beta.astype(np.float32)}, {"mode": 0}
    )


def _pool(kind: str):
    def parse(reader: _Reader) -> DlibLayer:
        window = (reader.integer(), reader.integer())
        stride = (reader.integer(), reader.integer())
        padding = (reader.integer(), reader.integer())
        return DlibLayer(
            kind,
            settings={
                "rows": window[0],
                "cols": window[1],
                "stride_y": stride[0],
                "stride_x": stride[1],
                "padding_y": padding[0],
                "padding_x": padding[1],
            },
        )

    return parse


def _fc(reader: _Reader) -> DlibLayer:
    outputs, inputs = reader.integer(), reader.integer()
    params = reader.tensor().reshape(-1)
    reader.alias_tensor()
    reader.alias_tensor()
    bias_mode = reader.integer()
    for _ in range(4):
        reader.floating()
    expected = inputs * outputs + (outputs if bias_mode == 0 else 0)
    if min(inputs, outputs) < 1 or params.size != expected:
        raise reader.fail(f"fc_ {inputs} -> {outputs} holds {params.size} parameters, not {expected}")
    arrays = {"weight": params[: inputs * outputs].reshape(inputs, outputs)}
    if bias_mode == 0:
        arrays["bias"] = params[inputs * outputs :]
    return DlibLayer("fc", arrays, {"outputs": outputs, "inputs": inputs})


def _plain(kind: str):
    return lambda reader: DlibLayer(kind)


_DETAILS = {
    "con_4": _con,
    "affine_": _affine,
    "bn_con2": _batch_norm,
    "relu_": _plain("relu"),
    "add_prev_": _plain("add_prev"),
    "max_pool_2": _pool("max_pool"),
    "avg_pool_2": _pool("avg_pool"),
    "fc_2": _fc,
}

__all__ = ["TAG_OR_SKIP", "DlibLayer", "DlibNetwork", "read_dlib_network"]
