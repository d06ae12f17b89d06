"""The `facetrain` command line (layer 4, imported by nothing but `python -m facetrain`).

Subcommands live in their own modules and are imported only when invoked (`lazy_group`), so
`facetrain --help` stays fast and a broken optional dependency of one command never breaks the others;
the only lazy imports of facetrain's own modules are here. User errors print as one line
(`user_errors`).
"""

from __future__ import annotations

import click

from facetrain.cli.lazy_group import LazyGroup
from facetrain.cli.version import show_version

# name -> "module:attribute" of the click command, in the order of the work, which `--help` keeps:
# make or prepare data, train, evaluate (the model, then its training set), ship and use the model, bring one in, measure, then the tools
COMMANDS = {
    "synth": "facetrain.cli.data_cmd:synth",
    "data": "facetrain.cli.data_cmd:data",
    "align": "facetrain.cli.align_cmd:align",
    "pack": "facetrain.cli.pack_cmd:pack",
    "pairs": "facetrain.cli.pairs_cmd:pairs",
    "train": "facetrain.cli.train_cmd:train",
    "eval": "facetrain.cli.eval_cmd:eval_command",
    "outliers": "facetrain.cli.outliers_cmd:outliers",
    "export": "facetrain.cli.export_cmd:export",
    "embed": "facetrain.cli.export_cmd:embed",
    "compare": "facetrain.cli.export_cmd:compare",
    "import": "facetrain.cli.import_cmd:import_group",
    "bench": "facetrain.cli.bench_cmd:bench",
    "config": "facetrain.cli.config_cmd:config",
    "plot": "facetrain.cli.plot_cmd:plot",
    "slurm-script": "facetrain.cli.slurm_cmd:slurm_script",
}


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=show_version,
    help="Show the version (and the commit, run from a checkout) and exit.",
)
def main() -> None:
    """facetrain: train face recognition and re-id models whose classifier is sharded over ranks.

    Inputs are positional, a model first (eval, export, embed, compare: MODEL); what a command
    writes goes to -o/--out; -q/--quiet turns off progress bars (docs/cli.md).

    \b
    Examples:
      facetrain synth -o data/synth                   # make the built-in dataset
      facetrain train -c demo --nproc 2               # recipe demo on 2 CPU processes
      facetrain eval runs/demo/checkpoints/last --pairs data/synth/heldout/pairs.txt
      facetrain export runs/demo/checkpoints/best -o runs/demo/export
      facetrain compare runs/demo/export a.png b.png
    """
