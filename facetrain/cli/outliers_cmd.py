"""`facetrain outliers`: the training images a run's own head marks as likely mislabelled."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.conventions import (
    batch_size_option,
    checked_output,
    device_option,
    quiet_option,
    workers_option,
)


@click.command()
@click.argument("run", metavar="RUN", type=click.Path(path_type=Path))
@click.option(
    "--max-angle",
    type=click.FloatRange(min=0, max=180),
    default=75.0,
    show_default=True,
    help="Degrees from its class's dominant sub-center beyond which an image is suspect (the "
    "sub-center ArcFace paper's 75).",
)
@batch_size_option()
@workers_option
@device_option
@click.option(
    "-o",
    "--out",
    "out_path",
    type=click.Path(path_type=Path),
    callback=checked_output,
    help="The CSV report (default: outliers.csv in the run directory).",
)
@click.option("--overwrite", is_flag=True, help="Replace an earlier report at --out.")
@quiet_option
def outliers(
    run: Path, max_angle: float, batch_size: int, workers: int, device: str | None, out_path: Path | None,
    overwrite: bool,
) -> None:  # fmt: skip
    """List the training images of RUN that its trained head marks as likely label noise.

    RUN is a training run directory (its last checkpoint), a checkpoint or a last/best pointer. Every
    image of the run's data (data.source, data.path) is embedded without the flip test and compared
    with the head's class centres. An image is flagged when its nearest sub-center is not its class's
    dominant one (the one most of the class's images are nearest to; head.sub_centers > 1), when it
    lies more than --max-angle degrees from that dominant centre (with one centre a class: from the
    class), or when another class's centre is nearer than its own. The CSV lists every image, flagged
    ones first and the furthest from their class first: path, label, identity, cosine to its class,
    cosine and angle to the dominant sub-center, both sub-centers, the nearest other class and its
    cosine, and the reasons; a line a reason with its count is printed. Nothing is moved or deleted:
    review the images, then clean the set and train again. An existing report is replaced only with
    --overwrite.

    \b
    Examples:
      facetrain outliers runs/demo
      facetrain outliers runs/ms1m/checkpoints/best --max-angle 70 --device cuda --workers 8
      facetrain outliers runs/orl -o reports/orl_outliers.csv --overwrite
    """
    from facetrain.checkpoint.run_dir import writing_into_run
    from facetrain.devices import resolve_device
    from facetrain.files import make_output_folder, refuse_to_overwrite
    from facetrain.output_files import refuse_what_is_no_file
    from facetrain.train.outliers import (
        default_report_path,
        find_outliers,
        trained_checkpoint,
        write_outlier_report,
    )

    device = resolve_device(device)
    checkpoint = trained_checkpoint(run)
    out_path = out_path or default_report_path(checkpoint)
    refuse_what_is_no_file([out_path])
    if not overwrite:  # before an image is read
        refuse_to_overwrite([out_path])
    report = find_outliers(checkpoint, device, max_angle, batch_size, workers)
    make_output_folder(out_path.parent, "-o")
    with writing_into_run(out_path, "facetrain outliers", "wait for it to finish, or pass -o elsewhere"):
        write_outlier_report(report, out_path)
    for line in report.summary(max_angle):
        click.echo(line)
    click.echo(f"wrote {out_path}")
