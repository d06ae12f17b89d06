"""`facetrain config`: see the resolved config before a run, or the one thing wrong with it; the recipes."""

from __future__ import annotations

import click
import yaml

from facetrain.cli.conventions import config_option


@click.command()
@config_option
@click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE", help="Override a value.")
@click.option(
    "--world-size",
    type=click.IntRange(min=1),
    help="Also check the rules that depend on the number of ranks (pipeline stages must divide it).",
)
@click.option("--recipes", "list_recipes", is_flag=True, help="List the recipes, each with what it is for.")
def config(
    config_path: str | None, overrides: tuple[str, ...], world_size: int | None, list_recipes: bool
) -> None:
    """Print the fully resolved config (defaults + file + overrides), or the one error it has.

    Every value is checked as `facetrain train` checks it, and every file or folder the config reads
    must exist: an error is one line naming the key, where it was given (the file or --set), the bad
    value and what is allowed, and the exit status is 2. A recipe's own data path is a placeholder
    for yours: when it is not there, the config still prints and a note says which key to set, so
    `facetrain config -c laptop > my.yaml` writes a starting config to edit.

    \b
    Examples:
      facetrain config --recipes                        # the recipes -c takes by name
      facetrain config -c laptop > my.yaml              # a starting config to edit
      facetrain config                                  # every key with its default
      facetrain config -c demo --set head.margin=cosface
      facetrain config -c configs/ms1mv3_r100.yaml --world-size 8
    """
    if list_recipes:
        from facetrain.config.recipes import recipe_purposes

        purposes = recipe_purposes()
        width = max(map(len, purposes))
        for name, purpose in purposes.items():
            click.echo(f"{name:<{width}}  {purpose}")
        return
    from facetrain.config import config_source, override_origins, show, to_dict, where_given
    from facetrain.config.recipes import is_recipe_name
    from facetrain.train.config_paths import missing_path
    from facetrain.train.run_checks import validate
    from facetrain.train.run_config import load_config

    cfg = load_config(config_path, overrides)
    source, given = config_source(config_path), override_origins(overrides)
    placeholder = None
    if config_path is not None and is_recipe_name(config_path):
        missing = missing_path(cfg.data, cfg.eval, cfg.model)
        if missing is not None and where_given(missing[0], source, given) == f"config {source}":
            placeholder = missing
    validate(cfg, world_size=world_size, source=source, given=given, reported=placeholder)
    click.echo(yaml.safe_dump(to_dict(cfg), sort_keys=False), nl=False)
    if placeholder is not None:
        key, value, _ = placeholder
        click.echo(
            f"note: {key} = {show(value)} is recipe {config_path}'s placeholder and is not here: set it to "
            f"yours (--set {key}=PATH, or in the file written) before training",
            err=True,
        )
