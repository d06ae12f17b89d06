"""`reid_r50`: torchvision's ResNet-50 as the strong re-id baseline uses it.

The last stage keeps stride 1 so a 256x128 pedestrian crop ends on a 16x8 map instead of 8x4, which
helps fine-grained appearance cues; weights start random (nothing is downloaded). With `ibn`, it is
IBN-Net's ResNet-50-IBN-a: the first BatchNorm of every bottleneck in layers 1-3 becomes half instance
normalisation.
"""

from __future__ import annotations

from collections import OrderedDict

from torchvision.models import resnet50

from facetrain.models.backbone import Backbone, ConvStage
from facetrain.models.embedding import PooledEmbedding
from facetrain.models.ibn import InstanceBatchNorm2d
from facetrain.models.registry import register_pooled

REID_INPUT_SIZE = (256, 128)


@register_pooled("reid_r50")
def reid_r50(
    embedding_size: int, dropout: float, input_size: tuple[int, int] | None, pooling: str, ibn: bool
) -> Backbone:
    net = resnet50(weights=None)
    if ibn:
        for layer in (net.layer1, net.layer2, net.layer3):
            for block in layer:
                block.bn1 = InstanceBatchNorm2d(block.bn1.num_features)
    last = net.layer4[0]
    last.conv2.stride = (1, 1)
    last.downsample[0].stride = (1, 1)
    stem = ConvStage(
        OrderedDict(conv=net.conv1, bn=net.bn1, act=net.relu, pool=net.maxpool), checkpointable=False
    )
    modules = OrderedDict(stem=stem)
    for name in ("layer1", "layer2", "layer3", "layer4"):
        modules[name] = ConvStage(OrderedDict(getattr(net, name).named_children()))
    modules["output"] = PooledEmbedding(net.fc.in_features, embedding_size, dropout, pooling)
    stages = [(name,) for name in modules]
    return Backbone(modules, embedding_size, input_size or REID_INPUT_SIZE, stages)
