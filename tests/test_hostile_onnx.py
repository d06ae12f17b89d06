"""Hostile ONNX files for `facetrain import insightface` (#38): external data anywhere in the model
(high item 2) and graphs that loop (high item 3) are refused in one line, reading nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from facetrain.errors import FacetrainError
from facetrain.export.onnx_graph import OnnxGraph
from tests.hostile_helpers import one_line_error

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


@pytest.mark.parametrize("location", ["secret.txt", "secret/secret.txt", "../secret.txt", "ABSOLUTE"])
def test_a_constant_nodes_external_data_is_never_read(tmp_path, monkeypatch, location) -> None:
    """Before, a Constant's data was read from the current folder and imported as a PReLU slope."""
    work = tmp_path / "work"
    (work / "secret").mkdir(parents=True)
    for secret in (work / "secret.txt", work / "secret" / "secret.txt", tmp_path / "secret.txt"):
        secret.write_bytes(SECRET)
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
