"""The line `facetrain train` prints when it runs without a config (-c).

The defaults describe a GPU run on a large set (r50, 128 images a rank); on a laptop they quietly cost
minutes a step and, with the default synthetic source, a generated set in ./data/synth first. That run
is not refused: on a GPU the defaults are sensible and `--set` may have made them small. It is said in
one line, with what it will do and the configs a newcomer should start from instead.
"""

from __future__ import annotations

from pathlib import Path

from facetrain.train.run_config import Config

STARTING_CONFIGS = {"configs/demo.yaml": "synthetic faces", "configs/laptop.yaml": "your own photos"}


def no_config_note(cfg: Config, device_type: str) -> str:
    """What a run without -c is about to do, why it may be slow, and where to start instead."""
    where = "a GPU" if device_type == "cuda" else "the CPU, sized for a GPU (a step may take minutes here)"
    starts = " or ".join(
        f"-c {path} ({what})" for path, what in STARTING_CONFIGS.items() if Path(path).is_file()
    )
    start = f"; start from {starts}" if starts else ""
    return (
        f"note: no config (-c): training {cfg.model.backbone} at batch {cfg.train.batch_size} a rank on "
        f"{where}, {_data(cfg)}{start}; `facetrain config` lists every key"
    )


def _data(cfg: Config) -> str:
    data = cfg.data
    if data.source != "synthetic":
        return f"on {data.path} (data.source {data.source})"
    if (Path(data.path) / "train").is_dir():
        return f"on the synthetic faces in {data.path}"
    synth = data.synth
    images = synth.identities * synth.images_per_identity
    images += synth.heldout_identities * synth.heldout_images_per_identity
    return (
        f"after generating {images:,} synthetic {synth.image_size}x{synth.image_size} faces into {data.path}"
    )
