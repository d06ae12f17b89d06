"""Person and camera ids from re-id image file names, in the naming schemes the public sets use.

Re-id sets keep no folder per person: each box's file name starts with the person id and says which
camera took it. Evaluation needs the camera (a match from the query's own camera is too easy to count),
so a name that gives no camera is an error, not a default.

- `market1501`: `0002_c1s1_000451_03.jpg`, camera after `c`; ids -1 (junk) and 0 (distractor) allowed
- `duke`: DukeMTMC-reID's `0005_c2_f0046985.jpg`, camera after `c`
- `cuhk03`: `0001_07.jpg`, shot 00-04 from camera A (camera 1), 05-09 from camera B (camera 2)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
CUHK03_SHOTS_PER_CAMERA = 5

_MARKET = re.compile(r"^(-?\d+)_c(\d+)s\d+_\d+_\d+$", re.IGNORECASE)
_DUKE = re.compile(r"^(-?\d+)_c(\d+)_f\d+$", re.IGNORECASE)
_CUHK03 = re.compile(r"^(\d+)_(\d{2})$")


def _camera_letter_pattern(pattern: re.Pattern) -> Callable[[str], tuple[int, int] | None]:
    def parse(stem: str) -> tuple[int, int] | None:
        match = pattern.match(stem)
        return None if match is None else (int(match.group(1)), int(match.group(2)))

    return parse


def _cuhk03(stem: str) -> tuple[int, int] | None:
    match = _CUHK03.match(stem)
    if match is None:
        return None
    return int(match.group(1)), 1 + int(match.group(2)) // CUHK03_SHOTS_PER_CAMERA


NAMING_SCHEMES: dict[str, Callable[[str], tuple[int, int] | None]] = {
    "market1501": _camera_letter_pattern(_MARKET),
    "duke": _camera_letter_pattern(_DUKE),
    "cuhk03": _cuhk03,
}
EXAMPLES = "0002_c1s1_000451_03.jpg (Market-1501), 0005_c2_f0046985.jpg (DukeMTMC), 0001_07.jpg (CUHK03)"


def naming_scheme(name: str | Path) -> str | None:
    """Which of `NAMING_SCHEMES` names this image, None for any other file."""
    path = Path(name)
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        return None
    return next((scheme for scheme, parse in NAMING_SCHEMES.items() if parse(path.stem)), None)


def parse_reid_name(name: str | Path) -> tuple[int, int] | None:
    """`(pid, camera)` of an image named in one of `NAMING_SCHEMES`, None for any other file."""
    scheme = naming_scheme(name)
    return None if scheme is None else NAMING_SCHEMES[scheme](Path(name).stem)
