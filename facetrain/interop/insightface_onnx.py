"""insightface's ONNX recognition models (`w600k_r50.onnx`, `glintr100.onnx`) as IResNet state dicts.

insightface makes them with `torch2onnx.py`: `torch.onnx.export` at opset 11 with constant folding,
which folds every BatchNorm that follows a convolution into that convolution's weight and a new bias.
The fold cannot be undone (a scale and a shift in, only their product and sum out), but it can be
represented exactly: the convolution keeps the folded weight and its BatchNorm becomes a pure shift,
weight 1, bias the folded bias, running mean 0 and running variance 1 - eps, so that in evaluation it
adds the bias and nothing else. The embeddings are the ONNX model's. In training mode such a
BatchNorm normalises by the batch as any other does, with its learned scale starting at 1; fine-tuning
learns it back.

The graph is walked by data flow, not by node names (constant folding renames the weights it makes):
input, conv1, PReLU, then blocks until the final BatchNorm. A block is the value's two readers, the
block's first BatchNorm and either the shortcut's strided convolution, which opens a new stage, or
the residual Add. The stage sizes that walk counts name the depth (iresnet50 is 3, 4, 14, 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from facetrain.choices import IRESNET_DEPTHS
from facetrain.interop.onnx_graph import OnnxGraph, OnnxNode
from facetrain.models.iresnet import BN_EPS, IRESNET_INPUT_SIZE

STAGES = 4
ONNX_BN_EPSILON = 1e-5  # BatchNormalization's default epsilon
CHANNELS_AT_THE_END = 512
MAP_SIDE = 7  # 112 halved four times


@dataclass(frozen=True)
class OnnxBackbone:
    state: dict[str, torch.Tensor]
    architecture: str
    embedding_size: int
    input_size: tuple[int, int]
    folded_batchnorms: int


def read_iresnet_onnx(path: Path, architecture: str | None = None) -> OnnxBackbone:
    """The IResNet state dict that computes what the ONNX model at `path` computes."""
    graph = OnnxGraph(path)
    walk = _Walk(graph)
    try:
        depths = walk.run()
    except (ValueError, IndexError, TypeError) as error:
        # shapes that contradict each other where the walk combines weights (a 1-D FC weight, a bias
        # of another length): the graph holds no IResNet, whatever the exception's name
        raise graph.fail(
            f"its weights do not fit together as an IResNet's ({type(error).__name__}: {str(error)[:120]})"
        ) from None
    matching = [name for name, known in IRESNET_DEPTHS.items() if known == depths]
    if not matching:
        raise graph.fail(
            f"its stages hold {depths} blocks, which is no IResNet facetrain has "
            f"({', '.join(f'{name} {known}' for name, known in IRESNET_DEPTHS.items())})"
        )
    if architecture is not None and architecture != matching[0]:
        raise graph.fail(
            f"its stages hold {depths} blocks, which is {matching[0]}, not {architecture}; "
            f"pass --arch {matching[0]}, or leave --arch out"
        )
    fc_weight = walk.state["fc.weight"]
    return OnnxBackbone(
        walk.state,
        matching[0],
        int(fc_weight.shape[0]),
        _input_size(graph, int(fc_weight.shape[1])),
        walk.folded,
    )


class _Walk:
    def __init__(self, graph: OnnxGraph):
        self.graph = graph
        self.state: dict[str, torch.Tensor] = {}
        self.folded = 0

    def run(self) -> tuple[int, ...]:
        graph = self.graph
        if len(graph.inputs) != 1:
            raise graph.fail(
                f"it has {len(graph.inputs)} inputs; a face recognition model takes one image batch"
            )
        conv = graph.next_node(graph.inputs[0], ("Conv",), "the input")
        value = self.conv_bn(conv, "conv1", "bn1", stride=1)
        value = self.prelu(graph.next_node(value, ("PRelu",), "conv1"), "prelu")
        depths: list[int] = []
        walked = set()
        while True:
            if value in walked:  # a block's Add fed back into an earlier block: it would never end
                raise graph.fail(f"the graph loops back to value {value[:80]!r} after {len(walked)} blocks")
            walked.add(value)
            readers = graph.users(value)
            norms = [node for node in readers if node.op == "BatchNormalization"]
            if len(readers) == 1 and norms:
                break
            others = [node for node in readers if node.op in ("Conv", "Add")]
            opens_stage = len(others) == 1 and others[0].op == "Conv"
            if len(readers) != 2 or len(norms) != 1 or len(others) != 1 or not (depths or opens_stage):
                found = ", ".join(node.op for node in readers) or "nothing"
                where = f"layer{len(depths)}.{depths[-1] - 1}" if depths else "the first PReLU"
                raise graph.fail(
                    f"after {where} the graph has {found} where an IResNet block (BatchNormalization and its "
                    "shortcut) belongs; it is not an insightface IResNet"
                )
            if opens_stage:
                depths.append(0)
            prefix = f"layer{len(depths)}.{depths[-1]}"
            value = self.block(value, norms[0], others[0], prefix, opens_stage)
            depths[-1] += 1
        self.batchnorm(norms[0], "bn2")
        self.head(norms[0].outputs[0])
        if len(depths) != STAGES:
            raise graph.fail(f"it has {len(depths)} stages where an IResNet has {STAGES}")
        return tuple(depths)

    def block(self, value: str, bn1: OnnxNode, shortcut: OnnxNode, prefix: str, opens_stage: bool) -> str:
        graph = self.graph
        self.batchnorm(bn1, f"{prefix}.bn1")
        out = self.conv_bn(
            graph.next_node(bn1.outputs[0], ("Conv",), f"{prefix}.bn1"), f"{prefix}.conv1", f"{prefix}.bn2", 1
        )
        out = self.prelu(graph.next_node(out, ("PRelu",), f"{prefix}.conv1"), f"{prefix}.prelu")
        stride = 2 if opens_stage else 1
        conv2 = graph.next_node(out, ("Conv",), f"{prefix}.prelu")
        out = self.conv_bn(conv2, f"{prefix}.conv2", f"{prefix}.bn3", stride)
        if shortcut.op == "Conv":
            value = self.conv_bn(shortcut, f"{prefix}.downsample.0", f"{prefix}.downsample.1", 2)
        add = graph.next_node(out, ("Add",), f"{prefix}.conv2")
        summed = {graph.source(name) for name in add.inputs}
        if summed != {graph.source(out), graph.source(value)}:
            raise graph.fail(f"{prefix}: the residual Add does not sum the block with its shortcut")
        return add.outputs[0]

    def conv_bn(self, conv: OnnxNode, conv_key: str, bn_key: str, stride: int) -> str:
        """Read a convolution and the BatchNorm after it, stored or folded into the convolution."""
        graph = self.graph
        weight = graph.constant(conv, 1, "weight")
        bias = graph.optional_constant(conv, 2, "bias")
        strides = list(conv.attributes.get("strides", [1, 1]))
        groups = graph.number(conv, "group", 1)
        if strides != [stride, stride] or groups != 1:
            raise graph.fail(
                f"convolution {conv.name[:80]!r} ({conv_key}) has strides {strides[:4]} and "
                f"{groups:g} groups; an IResNet's has stride {stride} and one group"
            )
        self.state[f"{conv_key}.weight"] = torch.from_numpy(weight.copy())
        readers = graph.users(conv.outputs[0])
        if len(readers) == 1 and readers[0].op == "BatchNormalization":
            self.batchnorm(readers[0], bn_key, shift=bias)
            return readers[0].outputs[0]
        channels = weight.shape[0]
        self.shift_only(bn_key, np.zeros(channels, np.float32) if bias is None else bias)
        self.folded += 1
        return conv.outputs[0]

    def batchnorm(self, node: OnnxNode, key: str, shift: np.ndarray | None = None) -> None:
        """A stored BatchNormalization; `shift` is a bias added before it, taken into its mean."""
        graph = self.graph
        scale, bias, mean, var = (
            graph.constant(node, i, role)
            for i, role in enumerate(("scale", "bias", "mean", "variance"), start=1)
        )
        epsilon = graph.number(node, "epsilon", ONNX_BN_EPSILON)
        if shift is not None:
            mean = mean - shift
        # facetrain's BatchNorm adds BN_EPS; the variance carries any difference in the file's epsilon
        self.set_batchnorm(key, scale, bias, mean, var + np.float32(epsilon - BN_EPS))

    def shift_only(self, key: str, bias: np.ndarray) -> None:
        ones = np.ones_like(bias)
        self.set_batchnorm(key, ones, bias, np.zeros_like(bias), ones - np.float32(BN_EPS))

    def set_batchnorm(self, key, weight, bias, mean, var) -> None:
        for name, value in {"weight": weight, "bias": bias, "running_mean": mean, "running_var": var}.items():
            self.state[f"{key}.{name}"] = torch.from_numpy(np.array(value, dtype=np.float32).reshape(-1))
        self.state[f"{key}.num_batches_tracked"] = torch.tensor(0)

    def prelu(self, node: OnnxNode, key: str) -> str:
        self.state[f"{key}.weight"] = torch.from_numpy(
            self.graph.constant(node, 1, "slope").reshape(-1).copy()
        )
        return node.outputs[0]

    def head(self, value: str) -> None:
        """Flatten, the FC (Gemm, or MatMul and Add) and the embedding BatchNorm, which ends the graph."""
        graph = self.graph
        flatten = graph.next_node(value, ("Flatten", "Reshape"), "bn2")
        fc = graph.next_node(flatten.outputs[0], ("Gemm", "MatMul"), "the flatten")
        if fc.op == "Gemm":
            weight = graph.constant(fc, 1, "FC weight") * graph.number(fc, "alpha", 1.0)
            if graph.number(fc, "transA", 0):
                raise graph.fail(f"Gemm {fc.name!r} transposes its input; an IResNet's FC does not")
            weight = weight if graph.number(fc, "transB", 0) else weight.T
            bias = graph.optional_constant(fc, 2, "FC bias")
            bias = None if bias is None else bias * graph.number(fc, "beta", 1.0)
            out = fc.outputs[0]
        else:
            weight = graph.constant(fc, 1, "FC weight").T
            add = graph.next_node(fc.outputs[0], ("Add",), "the FC")
            bias = graph.constant(
                add, 1 if graph.source(add.inputs[0]) == graph.source(fc.outputs[0]) else 0, "FC bias"
            )
            out = add.outputs[0]
        if weight.ndim != 2:
            raise graph.fail(
                f"its FC weight has shape {list(weight.shape)[:8]}, not the 2-D one of an IResNet's FC"
            )
        bias = (
            np.zeros(weight.shape[0], np.float32) if bias is None else np.broadcast_to(bias, weight.shape[:1])
        )
        self.state["fc.weight"] = torch.from_numpy(np.ascontiguousarray(weight))
        self.state["fc.bias"] = torch.from_numpy(np.array(bias, np.float32))
        readers = graph.users(out)
        if len(readers) == 1 and readers[0].op == "BatchNormalization":
            self.batchnorm(readers[0], "features")
            out = readers[0].outputs[0]
        else:  # folded away (an optimiser merged it into the FC)
            self.shift_only("features", np.zeros(weight.shape[0], np.float32))
        if graph.users(out) or out not in {graph.source(name) for name in graph.outputs}:
            raise graph.fail(
                "the embedding (FC and BatchNorm) is not the graph's output; only a bare IResNet graph imports"
            )


def _input_size(graph: OnnxGraph, fc_inputs: int) -> tuple[int, int]:
    """The image size the FC was sized for: insightface's 112x112, a 7x7 map of 512 channels."""
    if fc_inputs != CHANNELS_AT_THE_END * MAP_SIDE * MAP_SIDE:
        raise graph.fail(
            f"its FC takes {fc_inputs} numbers, not the {CHANNELS_AT_THE_END} x 7 x 7 of an IResNet for "
            "112x112 faces"
        )
    return IRESNET_INPUT_SIZE
