"""Drawing one synthetic face: traits fixed per identity, variation drawn per image.

The traits (face shape, skin and hair tone, hair style, eyes, brows, nose, mouth, ears, beard, glasses,
a mole) make identities separable by a network; the per-image variation (pose shift, in-plane rotation,
scale, a yaw-like shift of the inner features, expression, lighting, background, blur, noise) makes raw
pixels a poor identity cue, so a model has to learn something. Faces are drawn at twice the output size
and the pose warp also does the downsampling, which keeps thin strokes smooth.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

_SUPERSAMPLE = 2


@dataclass(frozen=True)
class IdentityTraits:
    """Proportions are fractions of the image side; colours are BGR."""

    face_width: float
    face_height: float
    jaw_width: float
    skin: tuple[float, float, float]
    hair: tuple[float, float, float]
    hair_style: int  # 0 short, 1 long, 2 receding, 3 fringe
    hairline: float
    eye_spacing: float
    eye_height: float
    eye_width: float
    eye_aspect: float
    iris: tuple[float, float, float]
    brow_gap: float
    brow_thickness: float
    brow_tilt: float
    nose_length: float
    nose_width: float
    mouth_height: float
    mouth_width: float
    lip: tuple[float, float, float]
    ear_size: float
    beard: bool
    glasses: bool
    mole: tuple[float, float] | None


def draw_identity_traits(rng: np.random.Generator) -> IdentityTraits:
    skin_red = rng.uniform(110, 245)
    skin = (skin_red * rng.uniform(0.5, 0.75), skin_red * rng.uniform(0.65, 0.85), skin_red)
    hair_level = rng.uniform(15, 200)
    hair_tint = rng.uniform(0.55, 1.0, size=3)
    hair = tuple(float(hair_level * t) for t in hair_tint)
    return IdentityTraits(
        face_width=rng.uniform(0.25, 0.35),
        face_height=rng.uniform(0.33, 0.43),
        jaw_width=rng.uniform(0.65, 1.0),
        skin=skin,
        hair=hair,  # type: ignore[arg-type]
        hair_style=int(rng.integers(0, 4)),
        hairline=rng.uniform(0.22, 0.32),
        eye_spacing=rng.uniform(0.08, 0.12),
        eye_height=rng.uniform(0.42, 0.49),
        eye_width=rng.uniform(0.035, 0.055),
        eye_aspect=rng.uniform(0.35, 0.7),
        iris=(rng.uniform(20, 160), rng.uniform(20, 130), rng.uniform(10, 100)),
        brow_gap=rng.uniform(0.04, 0.075),
        brow_thickness=rng.uniform(0.008, 0.025),
        brow_tilt=rng.uniform(-0.025, 0.025),
        nose_length=rng.uniform(0.08, 0.15),
        nose_width=rng.uniform(0.025, 0.05),
        mouth_height=rng.uniform(0.68, 0.76),
        mouth_width=rng.uniform(0.05, 0.1),
        lip=(
            skin[0] * rng.uniform(0.5, 0.8),
            skin[1] * rng.uniform(0.4, 0.7),
            skin[2] * rng.uniform(0.7, 0.95),
        ),
        ear_size=rng.uniform(0.035, 0.06),
        beard=bool(rng.random() < 0.2),
        glasses=bool(rng.random() < 0.2),
        mole=(rng.uniform(-0.15, 0.15), rng.uniform(0.5, 0.7)) if rng.random() < 0.3 else None,
    )


class _Canvas:
    """Drawing helpers in fractions of the side, so the traits are independent of the resolution."""

    def __init__(self, side: int, background: tuple[float, float, float]):
        self.side = side
        self.image = np.empty((side, side, 3), dtype=np.uint8)
        self.image[:] = np.clip(background, 0, 255).astype(np.uint8)

    def p(self, x: float, y: float) -> tuple[int, int]:
        return int(round(x * self.side)), int(round(y * self.side))

    def s(self, value: float) -> int:
        return max(1, int(round(value * self.side)))

    def ellipse(self, center, axes, color, angle=0.0, start=0, end=360, thickness=-1) -> None:
        cv2.ellipse(
            self.image,
            self.p(*center),
            (self.s(axes[0]), self.s(axes[1])),
            angle,
            start,
            end,
            _bgr(color),
            thickness if thickness < 0 else self.s(thickness),
            cv2.LINE_AA,
        )

    def line(self, a, b, color, thickness) -> None:
        cv2.line(self.image, self.p(*a), self.p(*b), _bgr(color), self.s(thickness), cv2.LINE_AA)

    def polygon(self, points, color) -> None:
        cv2.fillPoly(
            self.image, [np.array([self.p(*pt) for pt in points], np.int32)], _bgr(color), cv2.LINE_AA
        )


def _bgr(color) -> tuple[int, int, int]:
    return tuple(int(np.clip(c, 0, 255)) for c in color)  # type: ignore[return-value]


def _shade(color, factor: float) -> tuple[float, float, float]:
    return tuple(c * factor for c in color)  # type: ignore[return-value]


def _draw_head(canvas: _Canvas, t: IdentityTraits, yaw: float) -> None:
    cx, cy = 0.5, 0.52
    if t.hair_style == 1:
        canvas.ellipse((cx, cy + 0.05), (t.face_width + 0.06, t.face_height + 0.05), t.hair)
    canvas.ellipse((cx, cy - 0.04), (t.face_width + 0.03, t.face_height + 0.02), t.hair, start=180, end=360)
    ear_y = t.eye_height + 0.04
    for side in (-1, 1):
        visible = 1.0 - 0.6 * max(0.0, side * yaw)
        canvas.ellipse(
            (cx + side * (t.face_width - 0.005), ear_y),
            (t.ear_size * 0.6 * visible, t.ear_size),
            _shade(t.skin, 0.9),
        )
    canvas.ellipse((cx, cy), (t.face_width, t.face_height), t.skin)
    jaw_y = cy + t.face_height * 0.35
    canvas.ellipse((cx, jaw_y), (t.face_width * t.jaw_width, t.face_height * 0.65), t.skin, start=0, end=180)
    hair_top = cy - t.face_height
    if t.hair_style != 2:
        canvas.ellipse(
            (cx, hair_top + t.hairline * 0.45),
            (t.face_width * 1.02, t.hairline * 0.5),
            t.hair,
            start=180,
            end=360,
        )
    if t.hair_style == 3:
        canvas.ellipse(
            (cx - 0.05, hair_top + t.hairline * 0.5), (t.face_width * 0.8, 0.06), t.hair, angle=-12
        )
    if t.beard:
        canvas.ellipse(
            (cx, jaw_y + 0.02),
            (t.face_width * t.jaw_width * 0.95, t.face_height * 0.55),
            t.hair,
            start=15,
            end=165,
        )


def _draw_features(
    canvas: _Canvas, t: IdentityTraits, yaw: float, smile: float, eye_open: float, brow_raise: float
) -> None:
    cx = 0.5 + 0.05 * yaw
    for side in (-1, 1):
        eye_x = cx + side * t.eye_spacing * (1.0 - 0.25 * side * yaw)
        eye = (eye_x, t.eye_height)
        height = t.eye_width * t.eye_aspect * eye_open
        canvas.ellipse(eye, (t.eye_width, max(height, 0.004)), (235, 235, 235))
        canvas.ellipse(eye, (t.eye_width * 0.45, max(min(height, t.eye_width * 0.45), 0.004)), t.iris)
        canvas.ellipse(eye, (t.eye_width * 0.18, max(min(height, t.eye_width * 0.18), 0.003)), (15, 15, 15))
        brow_y = t.eye_height - t.brow_gap - brow_raise
        inner = (eye_x - side * t.eye_width * 0.9, brow_y + t.brow_tilt)
        outer = (eye_x + side * t.eye_width * 1.2, brow_y - t.brow_tilt)
        canvas.line(inner, outer, _shade(t.hair, 0.8), t.brow_thickness)
        if t.glasses:
            canvas.ellipse(eye, (t.eye_width * 1.5, t.eye_width * 1.2), (30, 30, 30), thickness=0.008)
    if t.glasses:
        bridge_left = (cx - t.eye_spacing + t.eye_width * 1.5, t.eye_height)
        bridge_right = (cx + t.eye_spacing - t.eye_width * 1.5, t.eye_height)
        canvas.line(bridge_left, bridge_right, (30, 30, 30), 0.008)
    nose_top = t.eye_height + 0.02
    nose_tip = nose_top + t.nose_length
    nose_x = cx + 0.03 * yaw
    canvas.polygon(
        [(nose_x, nose_top), (nose_x + t.nose_width, nose_tip), (nose_x - t.nose_width, nose_tip)],
        _shade(t.skin, 0.8),
    )
    canvas.ellipse((nose_x - t.nose_width * 0.5, nose_tip), (0.008, 0.005), _shade(t.skin, 0.5))
    canvas.ellipse((nose_x + t.nose_width * 0.5, nose_tip), (0.008, 0.005), _shade(t.skin, 0.5))
    mouth = (cx, t.mouth_height)
    curve = 0.03 * smile
    if curve >= 0:
        canvas.ellipse(mouth, (t.mouth_width, max(curve, 0.006)), t.lip, start=0, end=180, thickness=0.015)
    else:
        canvas.ellipse(
            (cx, t.mouth_height - curve), (t.mouth_width, -curve), t.lip, start=180, end=360, thickness=0.015
        )
    if t.mole is not None:
        canvas.ellipse((cx + t.mole[0], t.mole[1]), (0.008, 0.008), (40, 50, 70))


def render_face(traits: IdentityTraits, rng: np.random.Generator, size: int) -> np.ndarray:
    """One BGR uint8 image of `traits` under a fresh draw of pose, expression, lighting and noise."""
    canvas = _Canvas(size * _SUPERSAMPLE, tuple(rng.uniform(40, 220, size=3)))
    yaw = rng.uniform(-1.0, 1.0)
    _draw_head(canvas, traits, yaw)
    _draw_features(
        canvas,
        traits,
        yaw=yaw,
        smile=rng.uniform(-0.4, 1.0),
        eye_open=rng.uniform(0.45, 1.0),
        brow_raise=rng.uniform(-0.01, 0.015),
    )
    angle = rng.uniform(-12, 12)
    scale = rng.uniform(0.88, 1.12) / _SUPERSAMPLE
    center = (canvas.side / 2, canvas.side / 2)
    warp = cv2.getRotationMatrix2D(center, angle, scale)
    warp[:, 2] += np.array([size / 2, size / 2]) - np.array(center) * 1.0 + rng.uniform(-0.07, 0.07, 2) * size
    image = cv2.warpAffine(
        canvas.image, warp, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    ).astype(np.float32)
    image *= rng.uniform(0.7, 1.25)
    direction = rng.uniform(0, 2 * np.pi)
    ramp = (
        np.cos(direction) * np.linspace(-1, 1, size)[None, :]
        + np.sin(direction) * np.linspace(-1, 1, size)[:, None]
    )
    image *= (1.0 + rng.uniform(0.0, 0.35) * ramp)[:, :, None]
    sigma = rng.uniform(0.0, 1.3)
    if sigma > 0.3:
        image = cv2.GaussianBlur(image, (0, 0), sigma)
    image += rng.normal(0.0, rng.uniform(2.0, 9.0), size=image.shape).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)
