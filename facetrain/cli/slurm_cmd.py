"""`facetrain slurm-script`: the sbatch script that trains under Slurm, from the installed package."""

from __future__ import annotations

import click

MULTINODE_DEFAULT = "#SBATCH --nodes=2\n"


@click.command("slurm-script")
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Nodes the job asks for: 1 runs torchrun alone on its node, more meet in a c10d rendezvous.",
)
def slurm_script(nodes: int) -> None:
    """Print the sbatch script that runs `facetrain train` under Slurm, to save and submit.

    Every argument after the script goes to `facetrain train`. It stops the run with a checkpoint at
    the time-limit warning and requeues the job, which resumes by itself; without -o the run is
    runs/JOBNAME-JOBID. Its comments say what it does with each signal (docs/cluster.md).

    \b
    Examples:
      facetrain slurm-script > train.sbatch
      sbatch --gpus-per-node=8 --cpus-per-task=64 --time=24:00:00 train.sbatch -c ms1mv3_r100
      facetrain slurm-script --nodes 2 > train_multinode.sbatch
      sbatch --gpus-per-node=8 --cpus-per-task=64 train_multinode.sbatch -c glint360k_r100
    """
    from importlib.resources import files

    name = "train.sbatch" if nodes == 1 else "train_multinode.sbatch"
    text = (files(__package__) / "slurm" / name).read_text(encoding="utf-8")
    if nodes > 1:
        text = text.replace(MULTINODE_DEFAULT, f"#SBATCH --nodes={nodes}\n", 1)
    click.echo(text, nl=False)
