"""The run's config travels down the layers (tools/config_walk.py): libraries see their own section, never
the whole tree, and nothing below train/ calls up into it except through a registry or the generic
validator's checks, the two places built to call back."""

from __future__ import annotations

import json

from tests.support.train_helpers import run_cli, tiny_config
from tools.import_contract import LAYERS

LIBRARIES = set(LAYERS[1])
CALLBACK_SITES = {"facetrain.registry", "facetrain.config.validate"}


def test_the_config_reaches_libraries_as_sections_and_climbs_only_through_callbacks(tmp_path):
    config = tiny_config(tmp_path, "run", train={"steps": 2}, checkpoint={"every": 2})
    # forked from warm imports: the walk profiles the run's calls, which start after every import
    result = run_cli(str(config), "--json", timeout=600, module="tools.config_walk")
    assert result.returncode == 0, result.stderr
    walk = json.loads(result.stdout.splitlines()[-1])
    assert walk["descents"] > 0 and "facetrain.train.trainer" in walk["whole_tree"]
    assert not [m for m in walk["whole_tree"] if m.split(".")[1] in LIBRARIES]
    assert {caller for caller, _ in walk["climbs_between"]} <= CALLBACK_SITES
    assert walk["climbs"] == len(walk["climbs_between"])
