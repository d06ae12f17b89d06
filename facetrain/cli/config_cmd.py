"""`facetrain config`: see the resolved config before a run, or the one thing wrong with it."""

from __future__ import annotations

import click
import yaml


@click.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a value.")
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    help="Also check the rules that depend on the number of ranks (pipeline stages must divide it).",
)
def config(config_path: str | None, overrides: tuple[str, ...], world_size: int | None) -> None:
    """Print the fully resolved config (defaults + file + overrides), or the one error it has.

    Every value is checked as `facetrain train` checks it, and every file or folder the config reads
    must exist: an error is one line naming the key, where it was given (the file or --set), the bad
    value and what is allowed, and the exit status is 2.

    \b
    Examples:
      facetrain config                                  # every key with its default
      facetrain config -c configs/demo.yaml --set head.margin=cosface
      facetrain config -c configs/ms1mv3_r100.yaml --world-size 8
    """
    from facetrain.config import config_source, override_origins, to_dict
    from facetrain.train.run_checks import validate
    from facetrain.train.run_config import load_config

    cfg = load_config(config_path, overrides)
    validate(cfg, world_size=world_size, source=config_source(config_path), given=override_origins(overrides))
    click.echo(yaml.safe_dump(to_dict(cfg), sort_keys=False), nl=False)
