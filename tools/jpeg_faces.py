"""A folder of synthetic 112x112 JPEG faces, `OUT/id<NNNNN>/<n>.jpg`, rendered on every core: what
`facetrain bench train --from-folder` reads in the GPU check (tools/gpu_check.py, part 4).

    python tools/jpeg_faces.py OUT --identities 512 --images-per-identity 16

The faces are the synthetic renderer's (`facetrain bench data` writes the same kind one process at a
time): they compress and decode like real aligned crops, which noise would not. A face takes about 5 ms
to render, so 8,192 take 40 s on one core and a few seconds on 16.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import cv2
import numpy as np

from facetrain.data.synthetic_faces import draw_identity_traits, render_face

IMAGE_SIZE = 112
JPEG_QUALITY = 95


def write_identity(root: Path, identity: int, images: int) -> None:
    rng = np.random.default_rng(identity)
    traits = draw_identity_traits(rng)
    folder = root / f"id{identity:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    for number in range(images):
        ok, encoded = cv2.imencode(
            ".jpg", render_face(traits, rng, IMAGE_SIZE), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]
        )
        if not ok:
            raise OSError(f"cannot encode a JPEG in {folder}")
        (folder / f"{number:04d}.jpg").write_bytes(encoded.tobytes())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write; it must not exist")
    parser.add_argument("--identities", type=int, default=512)
    parser.add_argument("--images-per-identity", type=int, default=16)
    args = parser.parse_args()
    if args.out.exists():
        print(f"jpeg_faces: {args.out} exists; pass a new folder", file=sys.stderr)
        return 2
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        done = [
            pool.submit(write_identity, args.out, i, args.images_per_identity) for i in range(args.identities)
        ]
        for future in done:
            future.result()
    print(f"jpeg_faces: {args.identities * args.images_per_identity} faces in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
