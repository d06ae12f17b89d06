"""A small IJB-B/IJB-C release written in insightface's exact layout (no tests here).

Synthetic faces (`facetrain.data.synthetic_faces`) are placed into larger "loose crops" by a random
similarity transform, and the ArcFace template's five points, carried by the same transform, are
written as their landmarks, so aligning a loose crop by its landmarks gives the rendered face back.
Templates hold one or two media (a photo, or a "video" of two frames) of one identity; every pair of
templates is a verification pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import cv2
import numpy as np

from facetrain.align.template import ARCFACE_TEMPLATE_112
from facetrain.data.synthetic_faces import draw_identity_traits, render_face

LOOSE_SIZE = 160


@dataclass
class IjbSet:
    root: Path
    faces: list[np.ndarray]  # the rendered RGB 112x112 faces, in the meta files' order
    identities: dict[int, int]  # template id -> identity


def write_ijb_set(
    root: Path, target: str = "IJBC", identities: int = 4, templates_per_identity: int = 2, seed: int = 0
) -> IjbSet:
    rng = np.random.default_rng(seed)
    (root / "meta").mkdir(parents=True)
    (root / "loose_crop").mkdir()
    face_lines, point_lines, faces, template_identity = [], [], [], {}
    media = 7000
    for identity in range(identities):
        traits = draw_identity_traits(rng)
        for index in range(templates_per_identity):
            template = 100 + 10 * identity + index  # sparse ids, as IJB's are
            template_identity[template] = identity
            for _ in range(int(rng.integers(1, 3))):
                media += int(rng.integers(1, 4))
                for _ in range(int(rng.integers(1, 3))):
                    face = render_face(traits, rng, 112)
                    loose, landmarks = loose_crop(face, rng)
                    name = f"{len(faces) + 1}.jpg"
                    cv2.imwrite(str(root / "loose_crop" / name), loose, [cv2.IMWRITE_JPEG_QUALITY, 98])
                    faces.append(cv2.cvtColor(face, cv2.COLOR_BGR2RGB))
                    face_lines.append(f"{name} {template} {media}")
                    points = " ".join(f"{value:.3f}" for value in landmarks.ravel())
                    point_lines.append(f"{name} {points} {rng.uniform(0.5, 1.0):.4f}")
    pair_lines = [
        f"{first} {second} {int(template_identity[first] == template_identity[second])}"
        for first, second in combinations(sorted(template_identity), 2)
    ]
    prefix = target.lower()
    (root / "meta" / f"{prefix}_face_tid_mid.txt").write_text("\n".join(face_lines) + "\n")
    (root / "meta" / f"{prefix}_name_5pts_score.txt").write_text("\n".join(point_lines) + "\n")
    (root / "meta" / f"{prefix}_template_pair_label.txt").write_text("\n".join(pair_lines) + "\n")
    return IjbSet(root, faces, template_identity)


def loose_crop(face: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`face` (an aligned 112x112 crop) moved, turned and scaled into a larger photo, and where the
    template's five points landed in it."""
    matrix = cv2.getRotationMatrix2D((56.0, 56.0), rng.uniform(-15, 15), rng.uniform(1.0, 1.3))
    matrix[:, 2] += (LOOSE_SIZE / 2 - 56) + rng.uniform(-8, 8, 2)
    loose = cv2.warpAffine(
        face, matrix, (LOOSE_SIZE, LOOSE_SIZE), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    landmarks = ARCFACE_TEMPLATE_112 @ matrix[:, :2].T + matrix[:, 2]
    return loose, landmarks
