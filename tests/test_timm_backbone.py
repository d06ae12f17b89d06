"""`model.backbone: timm:<name>`: a timm model trains through `facetrain train` and resumes, and a
missing timm or a name timm does not know is one line naming model.backbone."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.models import timm_backbone
from tests.support.train_helpers import tiny_config

pytest.importorskip("timm")

BACKBONE = "timm:mobilenetv3_small_050"  # 0.4M parameters: two steps at 32x32 take a second


def train(*args: str):
    return CliRunner().invoke(main, ["train", *args])


def test_a_timm_backbone_trains_and_resumes_from_its_checkpoint(tmp_path):
    config = tiny_config(
        tmp_path, "run", model={"backbone": BACKBONE}, train={"steps": 2}, checkpoint={"every": 2}
    )
    first = train("-c", str(config))
    assert first.exit_code == 0, first.output
    resumed = train("-c", str(config), "--set", "train.steps=3", "--resume", "auto")
    assert resumed.exit_code == 0, resumed.output
    meta = json.loads((tmp_path / "run" / "checkpoints" / "step_00000003" / "meta.json").read_text())
    assert meta["step"] == 3


@pytest.mark.parametrize(
    "backbone, message",
    [
        ("timm:no_such_model", "model.backbone = 'timm:no_such_model': timm has no model 'no_such_model'"),
        ("no_such_model", "model.backbone = 'no_such_model': must be one of: "),
        # round 4 (#57): a tag timm does not list passed validation and was a traceback in train
        ("timm:resnet18.nonexistent_tag", "timm's resnet18 has no pretrained tag 'nonexistent_tag' (see "
         "timm.list_pretrained('resnet18.*'); checked against the installed timm, without network access)"),
        ("timm:resnet18.", "'resnet18.' is not a timm model name"),
        ("timm:hf-hub:timm/resnet18.a1_in1k", "'hf-hub:timm/resnet18.a1_in1k' is not a timm model name ("),
        ("timm:resnet18/../x", "is not a timm model name"),
    ],
)  # fmt: skip
def test_a_wrong_backbone_is_one_line_naming_the_key(tmp_path, backbone, message):
    result = train("-c", str(tiny_config(tmp_path, "run")), "--set", f"model.backbone={backbone}")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_without_timm_the_error_says_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setattr(timm_backbone, "timm_installed", lambda: False)
    result = train("-c", str(tiny_config(tmp_path, "run")), "--set", f"model.backbone={BACKBONE}")
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: --set: model.backbone = {BACKBONE!r}: needs timm, which is not installed (pip install timm)"
    ]
