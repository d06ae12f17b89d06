"""Hostile ONNX files for `facetrain import insightface` (#38): external data anywhere in the model
(high item 2) and graphs that loop (high item 3) are refused in one line, reading nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from facetrain.errors import FacetrainError
from facetrain.interop.onnx_graph import OnnxGraph
from tests.support.hostile_helpers import one_line_error

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

SECRET = b"TOPSECRET-0123456789abcdef"


def save_model(path: Path, nodes: list, initializers: tuple = ()) -> Path:
    graph = helper.make_graph(
        nodes,
        "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=list(initializers),
    )
    onnx.save(helper.make_model(graph), str(path))
    return path


def external_tensor(name: str, location: str) -> TensorProto:
    """A float tensor of 4 values whose data onnx would read from `location` (relative to the folder
    the reader passes, the current one when none)."""
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[4])
    tensor.data_location = TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=location)
    return tensor


# every kind of external-data location: inside the folder, nested, `..`, absolute, missing, a symlink
# (before, onnx's checker raised a ValidationError traceback for the last four)
LOCATIONS = ["secret.txt", "secret/secret.txt", "../secret.txt", "ABSOLUTE", "missing.bin", "link.txt"]


def place_secrets(tmp_path: Path) -> Path:
    """The folder `work` with the secret at each location of LOCATIONS that exists."""
    work = tmp_path / "work"
    (work / "secret").mkdir(parents=True)
    for secret in (work / "secret.txt", work / "secret" / "secret.txt", tmp_path / "secret.txt"):
        secret.write_bytes(SECRET)
    (work / "link.txt").symlink_to(work / "secret.txt")
    return work


@pytest.mark.parametrize("location", LOCATIONS)
def test_a_constant_nodes_external_data_is_never_read(tmp_path, monkeypatch, location) -> None:
    """Before, a Constant's data was read from the current folder and imported as a PReLU slope."""
    work = place_secrets(tmp_path)
    location = str(work / "secret.txt") if location == "ABSOLUTE" else location
    constant = helper.make_node("Constant", [], ["slope"], name="evil", value=external_tensor("c", location))
    model = save_model(work / "model.onnx", [constant, helper.make_node("PRelu", ["x", "slope"], ["y"])])
    monkeypatch.chdir(work)
    out = work / "imported"
    line = one_line_error("import", "insightface", model, "-o", out, "--quiet")
    assert line == (
        f"error: {model}: the 'value' of 'Constant' node 'evil' is stored in a separate file, which "
        "facetrain never reads; it imports ONNX models that hold their weights inline (as insightface's "
        "model zoo files do)"
    )
    assert not out.exists()


def test_an_initializers_external_data_is_refused_by_its_name(tmp_path) -> None:
    model = save_model(
        tmp_path / "model.onnx",
        [helper.make_node("PRelu", ["x", "w"], ["y"])],
        [external_tensor("w" * 5000, "big.bin")],
    )
    line = one_line_error("import", "insightface", model, "-o", tmp_path / "out", "--quiet")
    assert f"the initializer '{'w' * 80}...' is stored in a separate file" in line
    assert len(line) < 400 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("location", LOCATIONS)
def test_an_initializers_external_data_is_one_line_wherever_it_points(tmp_path, location) -> None:
    work = place_secrets(tmp_path)
    location = str(work / "secret.txt") if location == "ABSOLUTE" else location
    model = save_model(
        work / "model.onnx", [helper.make_node("PRelu", ["x", "w"], ["y"])], [external_tensor("w", location)]
    )
    line = one_line_error("import", "insightface", model, "-o", work / "out", "--quiet")
    assert line == (
        f"error: {model}: the initializer 'w' is stored in a separate file, which facetrain never reads; "
        "it imports ONNX models that hold their weights inline (as insightface's model zoo files do)"
    )
    assert not (work / "out").exists()


@pytest.mark.timeout(20)
def test_a_loop_of_identity_nodes_after_the_input_is_one_line(tmp_path) -> None:
    """Before, the walk from the input recursed through the loop until RecursionError."""
    loop = [
        helper.make_node("Identity", ["x"], ["a"], name="first"),
        helper.make_node("Identity", ["a"], ["b"], name="second"),
        helper.make_node("Identity", ["b"], ["a"], name="back"),
        helper.make_node("Relu", ["b"], ["y"]),
    ]
    model = save_model(tmp_path / "model.onnx", loop)
    line = one_line_error("import", "insightface", model, "-o", tmp_path / "out", "--quiet")
    assert line.startswith(f"error: {model}: the graph loops through Identity node ")
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(20)
def test_an_identity_feeding_itself_ends_the_search_for_a_source(tmp_path) -> None:
    """Before, `source` (which the residual Add's check asks) went round the self-loop forever."""
    nodes = [
        helper.make_node("Identity", ["s"], ["s"], name="selfloop"),
        helper.make_node("Add", ["x", "s"], ["y"], name="add"),
    ]
    graph = OnnxGraph(save_model(tmp_path / "model.onnx", nodes))
    with pytest.raises(FacetrainError, match=r"the graph loops through Identity node 'selfloop'"):
        graph.source("s")


def test_an_identity_without_input_is_one_line(tmp_path) -> None:
    nodes = [
        helper.make_node("Identity", [], ["s"], name="empty"),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    model = save_model(tmp_path / "model.onnx", nodes)
    with pytest.raises(FacetrainError, match=r"Identity node 'empty' has no input; the graph is malformed"):
        OnnxGraph(model).source("s")


def conv_model(path: Path, weight: TensorProto, **conv_attributes) -> Path:
    """x -> Conv(weight) -> y: the first node the import walks to, whose weight it reads first."""
    conv = helper.make_node("Conv", ["x", weight.name], ["y"], name="conv", **conv_attributes)
    return save_model(path, [conv], [weight])


def raw_tensor(name: str, data_type: int, dims: list[int], raw: bytes) -> TensorProto:
    return TensorProto(name=name, data_type=data_type, dims=dims, raw_data=raw)


FLOATS = raw_tensor("w", TensorProto.FLOAT, [2, 4, 1, 1], bytes(32))


@pytest.mark.parametrize(
    "weight, attributes, problem",
    [
        (raw_tensor("w", TensorProto.FLOAT, [4, 4, 1, 1], bytes(8)), {}, "initializer 'w' cannot be read: "),
        (
            raw_tensor("w", TensorProto.FLOAT, [1 << 40, 1, 1, 1], b""),
            {},
            "initializer 'w' has shape [1099511627776, 1, 1, 1], not a weight's (at most 268435456 values)",
        ),
        (
            helper.make_tensor("w", TensorProto.STRING, [2], [b"ab", b"cd"]),
            {},
            "initializer 'w' holds string values, not numbers; it is no model's weight",
        ),
        (
            TensorProto(name="w", data_type=0, dims=[1]),
            {},
            "initializer 'w' holds undefined values, not numbers",
        ),
        (FLOATS, {"group": float("nan")}, "Conv node 'conv': attribute group is 'nan', not a number"),
    ],
    ids=["short raw data", "huge dims", "strings", "undefined type", "NaN group"],
)
def test_malformed_weights_and_attributes_are_one_line(tmp_path, weight, attributes, problem) -> None:
    """Before: ValueError, TypeError or numpy's reshape errors as tracebacks."""
    model = conv_model(tmp_path / "model.onnx", weight, **attributes)
    line = one_line_error("import", "insightface", model, "-o", tmp_path / "out", "--quiet")
    assert line.startswith(f"error: {model}: {problem}")
    assert not (tmp_path / "out").exists()


def test_a_string_batchnorm_epsilon_is_one_line(tmp_path) -> None:
    params = [raw_tensor(name, TensorProto.FLOAT, [2], bytes(8)) for name in ("s", "b", "m", "v")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn", epsilon="abc"),
    ]
    model = save_model(tmp_path / "model.onnx", nodes, [FLOATS, *params])
    line = one_line_error("import", "insightface", model, "-o", tmp_path / "out", "--quiet")
    assert (
        line == f"error: {model}: BatchNormalization node 'bn': attribute epsilon is \"b'abc'\", not a number"
    )


def test_integer_weights_are_refused_as_in_a_pth(tmp_path) -> None:
    """Low item: int64 weights were converted to float silently, where a .pth's are refused."""
    model = conv_model(tmp_path / "model.onnx", raw_tensor("w", TensorProto.INT64, [2, 4, 1, 1], bytes(64)))
    line = one_line_error("import", "insightface", model, "-o", tmp_path / "out", "--quiet")
    assert (
        line
        == f"error: {model}: the weight of Conv node 'conv' holds int64 values, not floating-point weights"
    )
