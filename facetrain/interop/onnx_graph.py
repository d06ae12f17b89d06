"""An ONNX model read as data: its constant tensors and the nodes that consume each value.

Importing someone else's `.onnx` must never run it. `onnx.load` parses the protobuf only, external
data is refused wherever a tensor carries it (an initializer, a Constant node's value, any node's
tensor attribute, a subgraph's): a model zoo `.onnx` holds its weights inline, and an external path
is resolved by onnx against the current folder, so it could name any file on the machine. Nothing
here hands the graph to a runtime: the weights are read as numpy arrays and the graph is walked node
by node to find which layer each array belongs to.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from facetrain.errors import FacetrainError

# Nodes that pass their input through unchanged at inference: torch's export leaves `Identity` for
# deduplicated weights, a `Cast` to float where a module upcasts (`x.float()`), and `Dropout` when
# exported in training mode.
PASS_THROUGH = ("Identity", "Cast", "Dropout")
# TensorProto data types that hold numbers: FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, FLOAT16,
# DOUBLE, UINT32, UINT64, BFLOAT16 (not UNDEFINED, STRING, BOOL or the complex types)
NUMERIC_TYPES = frozenset({1, 2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 16})
MAX_TENSOR_VALUES = 1 << 28  # insightface's largest weight, glintr100's FC, holds 12.8 million


@dataclass
class OnnxNode:
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attributes: dict[str, object] = field(default_factory=dict)


class OnnxGraph:
    """The graph of `path`: constants by value name, and the consumers and producer of every value."""

    def __init__(self, path: Path):
        self.path = path
        model = _load(path)
        from onnx import helper, numpy_helper

        graph = model.graph
        self.constants: dict[str, np.ndarray] = {}
        for tensor in graph.initializer:
            self.constants[tensor.name] = self._array(
                tensor, f"initializer {_short(tensor.name)}", numpy_helper
            )
        nodes = []
        for proto in graph.node:
            attributes = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
            if proto.op_type == "Constant" and "value" in attributes and proto.output:
                where = f"the value of Constant node {_short(proto.name or proto.output[0])}"
                self.constants[proto.output[0]] = self._array(attributes["value"], where, numpy_helper)
                continue
            nodes.append(
                OnnxNode(proto.op_type, proto.name, list(proto.input), list(proto.output), attributes)
            )
        self.nodes = self._without_constant_aliases(nodes)
        initializers = {tensor.name for tensor in graph.initializer}
        self.inputs = [value.name for value in graph.input if value.name not in initializers]
        self.outputs = [value.name for value in graph.output]
        self.consumers: dict[str, list[OnnxNode]] = {}
        self.producers: dict[str, OnnxNode] = {}
        for node in self.nodes:
            for name in node.inputs:
                self.consumers.setdefault(name, []).append(node)
            for name in node.outputs:
                self.producers[name] = node

    def _without_constant_aliases(self, nodes: list[OnnxNode]) -> list[OnnxNode]:
        """Resolve `Identity` nodes whose input is a constant (torch's export shares equal weights so)."""
        kept = []
        for node in nodes:
            if node.op == "Identity" and node.inputs and node.inputs[0] in self.constants:
                self.constants[node.outputs[0]] = self.constants[node.inputs[0]]
            else:
                kept.append(node)
        return kept

    def _array(self, tensor, where: str, numpy_helper) -> np.ndarray:
        """A stored tensor as numbers, its declared size checked before anything is allocated: a
        string tensor, a negative or astronomic shape, raw data shorter than the shape, each one line."""
        if tensor.data_type not in NUMERIC_TYPES:
            raise self.fail(
                f"{where} holds {_type_name(tensor.data_type)} values, not numbers; it is no model's weight"
            )
        dims = list(tensor.dims)
        if any(side < 0 for side in dims) or math.prod(dims) > MAX_TENSOR_VALUES:
            raise self.fail(
                f"{where} has shape {dims[:8]}, not a weight's (at most {MAX_TENSOR_VALUES} values)"
            )
        try:
            return numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as error:
            raise self.fail(f"{where} cannot be read: {str(error)[:120]}") from None

    def number(self, node: OnnxNode, name: str, default: float) -> float:
        """A node's numeric attribute (an epsilon, a group count), which must be a finite number."""
        value = node.attributes.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(
                f"{node.op} node {_short(node.name)}: attribute {name} is {str(value)[:40]!r}, not a number"
            )
        return float(value)

    def fail(self, what: str) -> FacetrainError:
        return FacetrainError(f"{self.path}: {what}")

    def constant(self, node: OnnxNode, position: int, role: str) -> np.ndarray:
        """Input `position` of `node`, which must be a floating-point weight stored in the file (integers
        are refused as a `.pth`'s are: they would be converted silently)."""
        if position >= len(node.inputs) or node.inputs[position] not in self.constants:
            raise self.fail(
                f"{node.op} node {_short(node.name)} has no stored {role}; it is computed in the graph"
            )
        value = self.constants[node.inputs[position]]
        if not np.issubdtype(value.dtype, np.floating):
            raise self.fail(
                f"the {role} of {node.op} node {_short(node.name)} holds {value.dtype} values, not floating-point weights"
            )
        return np.asarray(value, dtype=np.float32)

    def optional_constant(self, node: OnnxNode, position: int, role: str) -> np.ndarray | None:
        if position >= len(node.inputs) or not node.inputs[position]:
            return None
        return self.constant(node, position, role)

    def users(self, value: str) -> list[OnnxNode]:
        """The nodes that read `value`, looking through pass-through nodes.

        Walked with a stack, not recursion, and each value once: a hostile file's loop of Identity
        nodes, or a chain of a million, is a one-line error rather than a RecursionError."""
        found: list[OnnxNode] = []
        seen = {value}
        pending = [iter(self.consumers.get(value, []))]
        while pending:
            node = next(pending[-1], None)
            if node is None:
                pending.pop()
            elif node.op not in PASS_THROUGH:
                found.append(node)
            else:
                output = self._passed_on(node, node.outputs, "output")
                if output in seen:
                    raise self._loop(node)
                seen.add(output)
                pending.append(iter(self.consumers.get(output, [])))
        return found

    def next_node(self, value: str, expected: tuple[str, ...], after: str) -> OnnxNode:
        """The one node that reads `value`, which must be one of `expected`."""
        users = self.users(value)
        if len(users) != 1 or users[0].op not in expected:
            found = ", ".join(node.op for node in users) or "nothing"
            raise self.fail(
                f"after {after} the graph has {found} where {' or '.join(expected)} belongs; "
                "it is not a graph of an architecture facetrain imports"
            )
        return users[0]

    def source(self, value: str) -> str:
        """`value`, or the value a chain of pass-through nodes copies it from (each visited once)."""
        seen = set()
        while value in self.producers and self.producers[value].op in PASS_THROUGH:
            if value in seen:
                raise self._loop(self.producers[value])
            seen.add(value)
            value = self._passed_on(self.producers[value], self.producers[value].inputs, "input")
        return value

    def _passed_on(self, node: OnnxNode, values: list[str], kind: str) -> str:
        if not values or not values[0]:
            raise self.fail(f"{node.op} node {_short(node.name)} has no {kind}; the graph is malformed")
        return values[0]

    def _loop(self, node: OnnxNode) -> FacetrainError:
        return self.fail(
            f"the graph loops through {node.op} node {_short(node.name)} (a value feeds back into what "
            "computes it); an ONNX model is acyclic, so the file is damaged or was made to hang readers"
        )


def _load(path: Path):
    if not path.is_file():
        raise FacetrainError(f"{path} does not exist or is not a file")
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError, RuntimeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FacetrainError(f"{path}: not a readable ONNX model ({reason[:200]})") from None
    external = next(
        (name for name, tensor in _tensors(model.graph) if tensor.data_location == onnx.TensorProto.EXTERNAL),
        None,
    )
    if external is not None:
        raise FacetrainError(
            f"{path}: the {external} is stored in a separate file, which facetrain never reads; "
            "it imports ONNX models that hold their weights inline (as insightface's model zoo files do)"
        )
    if not model.graph.node:
        raise FacetrainError(f"{path}: not a readable ONNX model (it holds no graph)")
    return model


def _tensors(graph) -> Iterator[tuple[str, object]]:
    """Every tensor a graph holds, each with what to call it in a message: its initializers, and each
    node's tensor attributes (a Constant's value among them), its subgraphs' included. Protobuf's
    parser bounds how deep subgraphs nest, so the recursion is bounded too."""
    for tensor in graph.initializer:
        yield f"initializer {_short(tensor.name)}", tensor
    for sparse in graph.sparse_initializer:
        yield f"initializer {_short(sparse.values.name)}", sparse.values
        yield f"initializer {_short(sparse.values.name)}", sparse.indices
    for node in graph.node:
        node_name = node.name or (node.output[0] if node.output else "")
        for attribute in node.attribute:
            where = f"{_short(attribute.name)} of {_short(node.op_type)} node {_short(node_name)}"
            sparse = [
                *attribute.sparse_tensors,
                *([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []),
            ]
            tensors = [*attribute.tensors, *([attribute.t] if attribute.HasField("t") else [])]
            for tensor in [*tensors, *(part for item in sparse for part in (item.values, item.indices))]:
                yield where, tensor
            for subgraph in [*attribute.graphs, *([attribute.g] if attribute.HasField("g") else [])]:
                yield from _tensors(subgraph)


def _type_name(data_type: int) -> str:
    from onnx import TensorProto

    names = {value: name.lower() for name, value in TensorProto.DataType.items()}
    return names.get(data_type, f"type {data_type}")


def _short(name: str, limit: int = 80) -> str:
    """A name from the file, quoted, cut so that a hostile megabyte-long name cannot flood the message."""
    return repr(name if len(name) <= limit else name[:limit] + "...")
