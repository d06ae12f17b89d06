"""What every `facetrain bench` command's options share, importable without torch."""

from __future__ import annotations

import click

from facetrain.choices import DEVICE_CHOICES


def device_option(help_text: str = "Where the benchmark runs; auto: cuda when torch sees a GPU, else cpu."):
    """The `--device` option every `facetrain bench` command shares."""
    return click.option(
        "--device", type=click.Choice(DEVICE_CHOICES), default="auto", show_default=True, help=help_text
    )
