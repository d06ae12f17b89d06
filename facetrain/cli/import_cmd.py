"""`facetrain import ...`: bring models trained elsewhere into facetrain."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.choices import INSIGHTFACE_ARCHITECTURES
from facetrain.cli.conventions import checked_output, quiet_option


@click.group("import")
def import_group() -> None:
    """Turn another project's trained weights into a facetrain checkpoint.

    \b
    Examples:
      facetrain import insightface ms1mv3_r100/backbone.pth -o models/ms1mv3_r100
      facetrain import insightface buffalo_l/w600k_r50.onnx -o models/w600k_r50
      facetrain import dlib -o models/dlib
    """


def destination_options(command):
    """-o/--out, --overwrite and -q/--quiet: where every import writes its checkpoint, and how."""
    out = click.option(
        "-o", "--out", "out_dir", type=click.Path(path_type=Path), required=True, callback=checked_output,
        help="Checkpoint folder to write.",
    )  # fmt: skip
    overwrite = click.option(
        "--overwrite",
        is_flag=True,
        help="Replace OUT if it is an earlier import (never a training checkpoint).",
    )
    return out(overwrite(quiet_option(command)))


@import_group.command("insightface")
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "--arch",
    "architecture",
    type=click.Choice(list(INSIGHTFACE_ARCHITECTURES)),
    default=None,
    help="The network the file was trained as (insightface's r18/r34/r50/r100/r200, mbf); "
    "by default read from its keys or graph, and checked when given.",
)
@destination_options
def insightface(source: Path, architecture: str | None, out_dir: Path, overwrite: bool) -> None:
    """Import insightface arcface_torch weights as a facetrain checkpoint.

    \b
    SOURCE is one of:
      backbone.pth    the state dict arcface_torch saves and its model zoo publishes (MS1MV3,
                      Glint360K, WebFace42M), also inside a `state_dict`, `model` or
                      `state_dict_backbone` entry and with DDP's `module.` prefix; read
                      weights-only (never unpickling an object)
      MODEL.onnx      a model zoo ONNX file (buffalo_l/w600k_r50.onnx, antelopev2/glintr100.onnx):
                      its weights are read as data, never run, and the BatchNorms torch2onnx
                      folded into the convolutions are represented exactly
      RUN_DIR         the folder an arcface_torch run wrote checkpoint_gpu_0.pt ... _N.pt into:
                      the backbone, the Partial FC head of every rank, the optimizer state and
                      the step, for `facetrain train --resume OUT` on any number of ranks

    The architecture (an IResNet depth, or MobileFaceNet `mbf`) is read from the file and checked
    against --arch when given; every key and shape is checked, and the first difference is
    reported. OUT is a checkpoint directory that `eval`, `export`, `embed`, `compare` and
    `train --init` take as is; inputs are 112x112 RGB normalized to (x - 127.5) / 127.5, as
    insightface trained them.

    \b
    Examples:
      facetrain import insightface ms1mv3_r100/backbone.pth -o models/ms1mv3_r100
      facetrain import insightface ~/.insightface/models/buffalo_l/w600k_r50.onnx -o models/w600k_r50
      facetrain import insightface ms1mv3_mbf/backbone.pth --arch mbf -o models/ms1mv3_mbf
      facetrain import insightface work_dirs/ms1mv3_r50 -o runs/r50/imported
      facetrain train -c configs/ms1mv3_r100.yaml --resume runs/r50/imported
      facetrain eval models/ms1mv3_r100 --pairs data/lfw.bin
      facetrain export models/ms1mv3_r100 -o models/ms1mv3_r100/export
      facetrain compare models/w600k_r50 a.jpg b.jpg --threshold 0.3
      facetrain import insightface glint360k_r50.pth --arch iresnet50 -o models/glint_r50 --overwrite
    """
    from facetrain.interop.insightface_run import import_insightface_run, is_insightface_run

    if is_insightface_run(source):
        run = import_insightface_run(source, architecture, out_dir, overwrite=overwrite)
        click.echo(
            f"imported the arcface_torch run {source} ({run.architecture}, {run.ranks} ranks, "
            f"{run.num_classes} classes, step {run.step}) into {run.checkpoint}; continue it with "
            f"`facetrain train ... --resume {run.checkpoint}`"
        )
        return
    from facetrain.interop.insightface_import import import_insightface

    result = import_insightface(source, architecture, out_dir, overwrite=overwrite)
    click.echo(
        f"imported {source} as {result.architecture} ({result.tensors} tensors, "
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
    from facetrain.interop.dlib_import import import_dlib

    result = import_dlib(dat, out_dir, overwrite=overwrite)
    click.echo(
        f"imported dlib's face ResNet as {result.architecture} ({result.tensors} tensors, "
        f"{result.embedding_size}-d embeddings) into {result.checkpoint}"
    )
