"""`facetrain config`: see the resolved config before a run."""

from __future__ import annotations

import click
import yaml


@click.command()
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file.")
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a value.")
def config(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Print the fully resolved config (defaults + file + overrides), or the one error it has.

    \b
    Examples:
      facetrain config                                  # every key with its default
      facetrain config -c configs/demo.yaml --set head.margin=cosface
    """
    from facetrain.config import load_config, to_dict

    click.echo(yaml.safe_dump(to_dict(load_config(config_path, overrides)), sort_keys=False), nl=False)
