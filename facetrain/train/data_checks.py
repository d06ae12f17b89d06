"""A training set a run can take but not learn from, said before the first step (#57, numbers).

One identity: the margin softmax over one class is 1 whatever the model does, so the loss is 0 from the
first step and the run "finishes" having learnt nothing. Every identity with one image: the head learns
each photo as a class of its own, and nothing about faces that generalises. Images that are each one
flat colour (all black: an aligner that found nothing, a decoder fed the wrong format): every embedding is
the same, and the loss stays at chance. The first is an error, the others a warning: a run on them is
legitimate, if useless, and a sample can be unlucky.
"""

from __future__ import annotations

import numpy as np
import torch

from facetrain.errors import EveryRankError

SAMPLED_IMAGES = 16  # images looked at for flat colour, spread over the set


def check_training_set(dataset, data_path: str) -> list[str]:
    """Refuse a set of fewer than 2 identities; the warnings for the others (empty when none apply)."""
    if dataset.num_classes < 2:
        names = ", ".join(dataset.class_names) or "none"
        raise EveryRankError(
            f"data.path {data_path} holds {dataset.num_classes} identity ({names}); the margin-softmax head "
            "learns to tell identities apart, so it needs at least 2: add identity folders"
        )
    warnings = []
    counts = np.bincount(np.asarray(dataset.labels), minlength=dataset.num_classes)
    if counts.max() == 1:
        warnings.append(
            f"warning: every identity in data.path {data_path} has one image: the head learns each photo as "
            "a class of its own and the backbone nothing that tells faces apart; a face set needs several "
            "images an identity"
        )
    flat = _flat_images(dataset)
    if flat is not None:
        warnings.append(
            f"warning: the {flat} images sampled from data.path {data_path} are each one flat colour (all "
            "black, say): every embedding will be the same and nothing can be learnt; check the images (or "
            "the aligner that wrote them)"
        )
    return warnings


def _flat_images(dataset) -> int | None:
    """How many images were sampled when each of them is one flat colour, else None."""
    picks = np.unique(np.linspace(0, len(dataset) - 1, num=min(SAMPLED_IMAGES, len(dataset))).astype(int))
    with torch.random.fork_rng(devices=[]):  # the augmentations' draws leave the run's stream as it was
        for index in picks:
            try:
                image = dataset[int(index)][0]
            except Exception:  # noqa: BLE001 - an unreadable image is the loader's to report, with its name
                return None
            if not torch.is_tensor(image) or bool((image.amax() != image.amin()).item()):
                return None
    return len(picks)
