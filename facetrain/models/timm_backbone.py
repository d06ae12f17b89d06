"""`timm:<name>`: any timm model as the backbone, its pooled features turned into the embedding.

timm builds the model with `num_classes=model.embedding_size`, so its own classifier becomes the
embedding layer (after whatever head the model has: mobilenetv3's 1024-wide conv_head, a ViT's
norm), with `model.dropout` as its `drop_rate`; a BatchNorm follows, as in IResNet's output, so the
margin head sees embeddings of an even scale. The model is always built with
`pretrained=False`: facetrain never downloads weights (start from your own with `model.init`).
timm is optional (`pip install timm`, or the `test` extra); the config check names model.backbone in
one line when it is missing or does not know the name.
"""

from __future__ import annotations

import importlib.util
import re
from collections import OrderedDict

from torch import nn

from facetrain.models.backbone import Backbone
from facetrain.models.embedding import WeightPrecisionBatchNorm1d
from facetrain.models.registry import BACKBONES

PREFIX = "timm:"
TIMM_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)?")  # arch or arch.tag, as timm names them


def timm_installed() -> bool:
    return importlib.util.find_spec("timm") is not None


def timm_problem(name: str) -> str | None:
    """None when timm is installed and knows `name` (`arch` or `arch.tag`); imports timm only when a
    config names it. Checked against the installed timm's own tables, without network access: a tag
    timm does not list would have passed here and raised a traceback when the model was built, and a
    hub or local-dir name (timm would fetch or read its config) is no name at all here."""
    if not TIMM_NAME.fullmatch(name):
        return (
            f"{name[:60]!r} is not a timm model name (letters, digits, '_' or '-', then an optional .tag; "
            "hub and local-dir names are not taken: facetrain never downloads)"
        )
    if not timm_installed():
        return "needs timm, which is not installed (pip install timm)"
    import timm

    architecture, _, tag = name.partition(".")
    if not timm.is_model(architecture):
        return f"timm has no model {architecture[:60]!r} (see timm.list_models(); checked offline)"
    if tag and name not in timm.list_pretrained(name):
        return (
            f"timm's {architecture} has no pretrained tag {tag[:60]!r} (see timm.list_pretrained('{architecture}.*'); "
            "checked against the installed timm, without network access)"
        )
    return None


@BACKBONES.register_prefix(PREFIX, timm_problem)
def timm_backbone(
    name: str, embedding_size: int, dropout: float, input_size: tuple[int, int] | None
) -> Backbone:
    """`input_size` None: the model's own (e.g. 224x224). Models with a fixed input grid (ViTs) take
    it as `img_size`; convolutional ones take any size and refuse that argument, so it is passed only
    to those that accept it."""
    import timm

    default = timm.get_pretrained_cfg_value(name, "input_size") or (3, 224, 224)
    size = tuple(input_size or default[1:])
    options = {"pretrained": False, "num_classes": embedding_size, "drop_rate": dropout}
    try:
        body = timm.create_model(name, img_size=size, **options)
    except TypeError:
        body = timm.create_model(name, **options)
    output = nn.Sequential(OrderedDict(features=WeightPrecisionBatchNorm1d(embedding_size)))
    return Backbone(OrderedDict(body=body, output=output), embedding_size, size, _stages(body))


def _stages(body: nn.Module) -> list[tuple[str, ...]]:
    """Two stages: the timm model without its classifier, then that classifier (the embedding FC, which
    timm's config names) with the BN after it. timm's layout inside a model varies too much to cut
    further; a model whose config names no single classifier is one stage, the BN the other."""
    classifier = getattr(body, "pretrained_cfg", {}).get("classifier")
    if not (isinstance(classifier, str) and classifier and _has_submodule(body, classifier)):
        return [("body",), ("output",)]
    rest: list[str] = []
    module, path = body, "body"
    for part in classifier.split("."):  # everything beside the path down to the classifier
        rest += [f"{path}.{name}" for name, _ in module.named_parameters(recurse=False)]
        rest += [f"{path}.{name}" for name, _ in module.named_children() if name != part]
        module, path = module.get_submodule(part), f"{path}.{part}"
    return [tuple(rest), (path, "output")]


def _has_submodule(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True
