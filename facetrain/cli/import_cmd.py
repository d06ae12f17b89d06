"""`facetrain import ...`: bring models trained elsewhere into facetrain."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.choices import IRESNET_DEPTHS
from facetrain.cli.conventions import quiet_option


@click.group("import")
def import_group() -> None:
    """Turn another project's trained weights into a facetrain checkpoint.

    \b
    Examples:
      facetrain import insightface ms1mv3_r100/backbone.pth --arch iresnet100 -o models/ms1mv3_r100
      facetrain import dlib -o models/dlib
    """


def destination_options(command):
    """-o/--out, --overwrite and -q/--quiet: where every import writes its checkpoint, and how."""
    out = click.option(
        "-o", "--out", "out_dir", type=click.Path(path_type=Path), required=True,
        help="Checkpoint folder to write.",
    )  # fmt: skip
    overwrite = click.option(
        "--overwrite",
        is_flag=True,
        help="Replace OUT if it is an earlier import (never a training checkpoint).",
    )
    return out(overwrite(quiet_option(command)))


@import_group.command("insightface")
@click.argument("backbone", type=click.Path(path_type=Path))
@click.option(
    "--arch",
    "architecture",
    type=click.Choice(list(IRESNET_DEPTHS)),
    required=True,
    help="The IResNet the file was trained as (insightface's r18/r34/r50/r100/r200).",
)
@destination_options
def insightface(backbone: Path, architecture: str, out_dir: Path, overwrite: bool) -> None:
    """Import an insightface arcface_torch BACKBONE.pth as a facetrain checkpoint (without a head).

    BACKBONE is the `backbone.pth` that arcface_torch saves and its model zoo publishes (MS1MV3,
    Glint360K, WebFace42M): a state dict of tensors, also accepted inside a `state_dict`, `model` or
    `state_dict_backbone` entry (arcface_torch's checkpoint_gpu_N.pt) and with DDP's `module.`
    prefix. It is read weights-only (never unpickling an object), every key and shape is checked
    against --arch, and the first difference is reported. OUT is a checkpoint directory that `eval`,
    `export`, `embed` and `compare` take as is; inputs are 112x112 RGB normalized to
    (x - 127.5) / 127.5, as insightface trained them.

    \b
    Examples:
      facetrain import insightface ms1mv3_r100/backbone.pth --arch iresnet100 -o models/ms1mv3_r100
      facetrain eval models/ms1mv3_r100 --pairs data/lfw.bin
      facetrain export models/ms1mv3_r100 -o models/ms1mv3_r100/export
      facetrain compare models/ms1mv3_r100 a.jpg b.jpg --threshold 0.3
      facetrain import insightface glint360k_r50.pth --arch iresnet50 -o models/glint_r50 --overwrite
    """
    from facetrain.export.insightface_import import import_insightface

    result = import_insightface(backbone, architecture, out_dir, overwrite=overwrite)
    click.echo(
        f"imported {backbone} as {result.architecture} ({result.tensors} tensors, "
        f"{result.embedding_size}-d embeddings) into {result.checkpoint}"
    )


@import_group.command("dlib")
@click.argument("dat", required=False, type=click.Path(path_type=Path))
@destination_options
def dlib(dat: Path | None, out_dir: Path, overwrite: bool) -> None:
    """Import dlib's pretrained face recognition ResNet as a facetrain checkpoint (backbone `dlib_resnet`).

    DAT is dlib's `dlib_face_recognition_resnet_model_v1.dat` (128-d embeddings of 150x150 chips);
    by default the one the `face-recognition-models` package installs. It is decoded in Python
    (no dlib call, nothing executed), every layer is checked against `dlib_resnet`, and the first
    difference is reported. OUT is a checkpoint directory that `eval`, `export`, `embed`, `compare`
    and `train --init` take as is. Inputs are 150x150 RGB chips as `facetrain align --template dlib`
    cuts them, normalized as every facetrain model is: the backbone turns that into dlib's
    (pixel - mean) / 256 itself, so its embeddings are dlib's `compute_face_descriptor`.

    \b
    Examples:
      facetrain import dlib -o models/dlib
      facetrain align photos/ -o chips/ --template dlib
      facetrain eval models/dlib --folder chips/
      facetrain compare models/dlib a.jpg b.jpg
      facetrain import dlib ~/dlib_face_recognition_resnet_model_v1.dat -o models/dlib --overwrite
    """
    from facetrain.export.dlib_import import import_dlib

    result = import_dlib(dat, out_dir, overwrite=overwrite)
    click.echo(
        f"imported dlib's face ResNet as {result.architecture} ({result.tensors} tensors, "
        f"{result.embedding_size}-d embeddings) into {result.checkpoint}"
    )
