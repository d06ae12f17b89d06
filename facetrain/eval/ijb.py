"""IJB-B / IJB-C 1:1 template verification, following insightface's eval_ijbc.py protocol.

    result = evaluate_ijb(model, "IJB_release/IJBC", "IJBC", EmbedSettings((112, 112)), FivePointCrop((112, 112)))
    print(result.tar_at_far[1e-4])

Each loose crop is aligned by its five landmarks with the caller's `crop` (`facetrain eval --ijb` passes
`facetrain.align.five_points.FivePointCrop`, the ArcFace template as eval_ijbc.py aligns) and
embedded with its mirror, the two raw embeddings summed (eval_ijbc.py's flip test "F2"); the sum keeps
its norm, which the protocol counts as face quality ("N1"), and is multiplied by the detector's score
("D1"). Faces are pooled by media, then by template (`template_pooling`), template pairs are scored
by cosine similarity, and TAR at FAR 1e-6 ... 1e-1 is read off the ROC by eval_ijbc.py's rule
(`ijb_roc`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from facetrain.eval.embedding import EmbedSettings, compute_embeddings
from facetrain.eval.ijb_faces import AlignedFaces, FaceCrop
from facetrain.eval.ijb_meta import read_ijb_meta
from facetrain.eval.ijb_roc import IjbRoc, ijb_roc
from facetrain.eval.template_pooling import template_features, template_pair_scores


@dataclass(frozen=True)
class IjbResult:
    target: str
    root: str
    num_images: int
    num_templates: int
    num_pairs: int
    num_matched: int
    roc: IjbRoc
    scores: np.ndarray  # one per template pair, in the pair file's order
    xnorm: float
    flip: bool

    @property
    def name(self) -> str:
        """Names the report files: ijbc.json, ijbc_roc.png, ijbc_scores.npy (as eval_ijbc.py's ijbc.npy)."""
        return self.target.lower()

    @property
    def tar_at_far(self) -> dict[float, float]:
        return self.roc.tar_at_far

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "dataset": self.root,
            "num_images": self.num_images,
            "num_templates": self.num_templates,
            "num_pairs": self.num_pairs,
            "num_matched": self.num_matched,
            "num_mismatched": self.num_pairs - self.num_matched,
            "flip": self.flip,
            "detector_score_weighting": True,
            "tar_at_far": {f"{far:g}": tar for far, tar in self.tar_at_far.items()},
            "tar_at_far_rule": "TPR of the ROC point whose FPR is nearest the target (insightface eval_ijbc.py)",
            "auc": self.roc.auc,
            "xnorm": self.xnorm,
        }


def evaluate_ijb(
    module: nn.Module, root: str | Path, target: str, settings: EmbedSettings, crop: FaceCrop
) -> IjbResult:
    """Read the protocol, embed every face (`crop` aligns each to `image_size`), pool templates and score
    the template pairs."""
    meta = read_ijb_meta(root, target)
    faces = AlignedFaces(meta.image_paths, meta.landmarks, crop)
    embedded = compute_embeddings(module, faces, settings, label=f"{target} faces", normalized=False)
    weighted = embedded.vectors.astype(np.float64) * meta.detector_scores[:, None]
    template_ids, features = template_features(weighted, meta.templates, meta.medias)
    scores = template_pair_scores(template_ids, features, meta.pair_templates)
    return IjbResult(
        target=target,
        root=str(root),
        num_images=len(meta.image_paths),
        num_templates=len(template_ids),
        num_pairs=len(scores),
        num_matched=int(meta.labels.sum()),
        roc=ijb_roc(meta.labels, scores),
        scores=scores,
        xnorm=embedded.xnorm,
        flip=settings.flip,
    )
