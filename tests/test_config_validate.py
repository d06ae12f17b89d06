"""Every config value is checked before anything runs: one line naming the file, key, value and rule."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.config import apply_override
from facetrain.config.checks import Registered, RegisteredSuffix, field_checks
from facetrain.errors import FacetrainError
from facetrain.models import BACKBONES
from facetrain.train.run_checks import validate
from facetrain.train.run_config import Config, load_config
from tests.support.train_helpers import run_cli

REPO = Path(__file__).resolve().parents[1]

# (overrides, key, value as the message shows it); the ones issue 14 names come first
BAD_VALUES = [
    (["train.batch_size=0"], "train.batch_size", "0"),
    (["train.steps=-5"], "train.steps", "-5"),
    (["optim.lr=-0.1"], "optim.lr", "-0.1"),
    (["data.num_workers=-1"], "data.num_workers", "-1"),
    (["train.log_every=0"], "train.log_every", "0"),
    (["checkpoint.every=0"], "checkpoint.every", "0"),
    (["checkpoint.every_minutes=0"], "checkpoint.every_minutes", "0.0"),
    (["train.global_batch=0"], "train.global_batch", "0"),
    (["optim.grad_accumulation=0"], "optim.grad_accumulation", "0"),
    (["optim.momentum=-0.5"], "optim.momentum", "-0.5"),
    # absurdly large: bounded, not an overflow inside a rank (issue 25)
    (["train.batch_size=99999999999999999999"], "train.batch_size", "99999999999999999999"),
    (["eval.batch_size=99999999999999999999"], "eval.batch_size", "99999999999999999999"),
    (["data.num_workers=99999999999999999999"], "data.num_workers", "99999999999999999999"),
    (["parallel.timeout_s=1e308"], "parallel.timeout_s", "1e+308"),
    # data
    (["data.source=bogus"], "data.source", "'bogus'"),
    (["data.path=''"], "data.path", "''"),
    (["data.image_size=[112]"], "data.image_size", "[112]"),
    (["data.image_size=[112, 4]"], "data.image_size", "[112, 4]"),
    (["data.prefetch_factor=0"], "data.prefetch_factor", "0"),
    (["data.sampler=bogus"], "data.sampler", "'bogus'"),
    (["data.images_per_identity=0"], "data.images_per_identity", "0"),
    (["data.augment.crop_scale=[0.9, 0.5]"], "data.augment.crop_scale", "[0.9, 0.5]"),
    (["data.augment.crop_scale=[0, 1]"], "data.augment.crop_scale", "[0.0, 1.0]"),
    (["data.augment.color_jitter=-0.1"], "data.augment.color_jitter", "-0.1"),
    (["data.augment.rotation=-1"], "data.augment.rotation", "-1.0"),
    (["data.augment.shift=0.6"], "data.augment.shift", "0.6"),
    (["data.augment.scale=[1.2, 0.9]"], "data.augment.scale", "[1.2, 0.9]"),
    (["data.augment.grayscale=1.5"], "data.augment.grayscale", "1.5"),
    (["data.augment.blur=-0.1"], "data.augment.blur", "-0.1"),
    (["data.augment.blur_sigma=[0, 1]"], "data.augment.blur_sigma", "[0.0, 1.0]"),
    (["data.augment.random_erasing=2"], "data.augment.random_erasing", "2.0"),
    (["data.augment.erasing_area=[0.3, 0.1]"], "data.augment.erasing_area", "[0.3, 0.1]"),
    (["data.synth.identities=0"], "data.synth.identities", "0"),
    (["data.synth.images_per_identity=0"], "data.synth.images_per_identity", "0"),
    (["data.synth.heldout_identities=-1"], "data.synth.heldout_identities", "-1"),
    (["data.synth.heldout_identities=3"], "data.synth.heldout_identities", "3"),
    (["data.synth.heldout_images_per_identity=0"], "data.synth.heldout_images_per_identity", "0"),
    (["data.synth.pairs_folds=0"], "data.synth.pairs_folds", "0"),
    (["data.synth.pairs_per_fold=0"], "data.synth.pairs_per_fold", "0"),
    (["data.synth.image_size=4"], "data.synth.image_size", "4"),
    (["data.synth.seed=-1"], "data.synth.seed", "-1"),
    # model
    (["model.backbone=r999"], "model.backbone", "'r999'"),
    (["model.embedding_size=0"], "model.embedding_size", "0"),
    (["model.dropout=1.0"], "model.dropout", "1.0"),
    (["model.ema_decay=1.0"], "model.ema_decay", "1.0"),
    (["model.pooling=max"], "model.pooling", "'max'"),
    (["model.init=''"], "model.init", "''"),
    (["model.init=/no/such/model"], "model.init", "'/no/such/model'"),
    # head
    (["head.margin=bogus"], "head.margin", "'bogus'"),
    (["head.scale=0"], "head.scale", "0.0"),
    (["head.sample_rate=0"], "head.sample_rate", "0.0"),
    (["head.sample_rate=1.5"], "head.sample_rate", "1.5"),
    (["head.margin_params={x: 1}"], "head.margin_params", "{'x': 1.0}"),
    (["head.margin=sphereface", "head.margin_params={m: 0.5}"], "head.margin_params", "{'m': 0.5}"),
    (["head.margin_warmup_steps=-1"], "head.margin_warmup_steps", "-1"),
    (["head.label_smoothing=1"], "head.label_smoothing", "1.0"),
    (["head.label_smoothing=-0.1"], "head.label_smoothing", "-0.1"),
    (["head.label_smoothing=0.1", "head.kernel=triton"], "head.kernel", "'triton'"),
    (["head.init=mean"], "head.init", "'mean'"),
    (["head.mode=fast"], "head.mode", "'fast'"),
    (["head.kernel=cuda"], "head.kernel", "'cuda'"),
    (["head.tile_classes=0"], "head.tile_classes", "0"),
    (["head.weight_dtype=fp16"], "head.weight_dtype", "'fp16'"),
    (["head.state_dtype=fp64"], "head.state_dtype", "'fp64'"),
    (["head.sub_centers=0"], "head.sub_centers", "0"),
    (["head.sub_centers=3", "head.mode=tiled"], "head.sub_centers", "3"),
    (["head.gradient_filter=1"], "head.gradient_filter", "1.0"),
    (["head.gradient_filter=0.001", "head.mode=untiled"], "head.gradient_filter", "0.001"),
    # loss
    (["loss.name=bogus"], "loss.name", "'bogus'"),
    (["loss.identity_weight=0"], "loss.identity_weight", "0.0"),
    (["loss.triplet_weight=-1"], "loss.triplet_weight", "-1.0"),
    (["loss.triplet_margin=0"], "loss.triplet_margin", "0.0"),
    (["loss.name=margin_triplet"], "loss.name", "'margin_triplet'"),
    (["loss.teacher=''"], "loss.teacher", "''"),
    (["loss.teacher=no/such/teacher"], "loss.teacher", "'no/such/teacher'"),
    (["loss.teacher_loss=kl"], "loss.teacher_loss", "'kl'"),
    (["loss.teacher_weight=0"], "loss.teacher_weight", "0.0"),
    (["loss.teacher_cache=true"], "loss.teacher_cache", "True"),  # no teacher to cache
    (["loss.teacher=t", "loss.teacher_cache=true"], "loss.teacher_cache", "True"),  # the default flip
    # optim
    (["optim.name=bogus"], "optim.name", "'bogus'"),
    (["optim.lr=0"], "optim.lr", "0.0"),
    (["optim.lr=.nan"], "optim.lr", "nan"),
    (["optim.lr=.inf"], "optim.lr", "inf"),
    (["optim.momentum=1.0"], "optim.momentum", "1.0"),
    (["optim.weight_decay=-1"], "optim.weight_decay", "-1.0"),
    (["optim.head_weight_decay=-1"], "optim.head_weight_decay", "-1.0"),
    (["optim.betas=[0.9, 1.0]"], "optim.betas", "[0.9, 1.0]"),
    (["optim.schedule=bogus"], "optim.schedule", "'bogus'"),
    (["optim.power=0"], "optim.power", "0.0"),
    (["optim.warmup_steps=-1"], "optim.warmup_steps", "-1"),
    (["optim.min_lr=-1"], "optim.min_lr", "-1.0"),
    (["optim.min_lr=1"], "optim.min_lr", "1.0"),
    (["optim.grad_clip=0"], "optim.grad_clip", "0.0"),
    (["optim.backbone_lr_scale=0"], "optim.backbone_lr_scale", "0.0"),
    (["optim.head_only_steps=-1"], "optim.head_only_steps", "-1"),
    (["optim.freeze_stages=-1"], "optim.freeze_stages", "-1"),
    (["optim.freeze_stages=99999999999999999999"], "optim.freeze_stages", "99999999999999999999"),
    (["optim.layer_decay=0"], "optim.layer_decay", "0.0"),
    (["optim.layer_decay=1.5"], "optim.layer_decay", "1.5"),
    # train
    (["train.output_dir=''"], "train.output_dir", "''"),
    (["train.seed=-1"], "train.seed", "-1"),
    (["train.precision=fp64"], "train.precision", "'fp64'"),
    (["checkpoint.keep=0"], "checkpoint.keep", "0"),
    (["train.max_nonfinite_steps=-1"], "train.max_nonfinite_steps", "-1"),
    (["train.trackers=[neptune]"], "train.trackers", "['neptune']"),
    # eval
    (["eval.pairs=pairs.json"], "eval.pairs", "'pairs.json'"),
    (["eval.images=''"], "eval.images", "''"),
    (["eval.every=-1"], "eval.every", "-1"),
    (["eval.pairs=[lfw.bin, cfp.json]"], "eval.pairs", "['lfw.bin', 'cfp.json']"),
    (["eval.pairs=[]"], "eval.pairs", "[]"),
    (["eval.best_by=''"], "eval.best_by", "''"),
    (["eval.best_min_gain=-0.01"], "eval.best_min_gain", "-0.01"),
    (["eval.best_min_gain=1"], "eval.best_min_gain", "1.0"),
    (["eval.batch_size=0"], "eval.batch_size", "0"),
    # parallel
    (["parallel.backend=mpi"], "parallel.backend", "'mpi'"),
    (["parallel.timeout_s=0"], "parallel.timeout_s", "0.0"),
    (["parallel.pipeline_stages=0"], "parallel.pipeline_stages", "0"),
    (["parallel.microbatches=0"], "parallel.microbatches", "0"),
    (["parallel.schedule=bogus"], "parallel.schedule", "'bogus'"),
    (["parallel.split_points=['']"], "parallel.split_points", "['']"),
    (["parallel.split_points=[stage2]"], "parallel.split_points", "['stage2']"),
    # rules across keys
    (["data.sampler=identity", "train.batch_size=10"], "train.batch_size", "10"),
    (["parallel.pipeline_stages=2", "train.precision=bf16"], "train.precision", "'bf16'"),
    (["parallel.pipeline_stages=2", "optim.grad_accumulation=2"], "optim.grad_accumulation", "2"),
    (["parallel.pipeline_stages=2", "eval.pairs=p.txt"], "eval.pairs", "'p.txt'"),
    (["parallel.pipeline_stages=2", "parallel.microbatches=3"], "parallel.microbatches", "3"),
    (["parallel.pipeline_stages=2", "optim.head_only_steps=5"], "optim.head_only_steps", "5"),
    (["parallel.pipeline_stages=2", "optim.freeze_stages=1"], "optim.freeze_stages", "1"),
    (["parallel.pipeline_stages=2", "loss.teacher=."], "loss.teacher", "'.'"),
    (["head.init=class_means"], "head.init", "'class_means'"),
    (["parallel.pipeline_stages=2", "model.init=.", "head.init=class_means"], "head.init", "'class_means'"),
    (
        ["parallel.pipeline_stages=4", "parallel.microbatches=2", "parallel.schedule=1f1b"],
        "parallel.microbatches",
        "2",
    ),
    (["parallel.pipeline_stages=3", "parallel.split_points=[stage2]"], "parallel.split_points", "['stage2']"),
    (["model.bn_neck=false"], "model.bn_neck", "False"),
    (["loss.name=margin_triplet", "data.sampler=identity"], "loss.name", "'margin_triplet'"),
]

# wrong types are the loader's one line (no range to check on a boolean)
BAD_TYPES = [
    "data.skip_bad_images",
    "data.pin_memory",
    "data.persistent_workers",
    "data.augment.horizontal_flip",
    "data.augment.random_resized_crop",
    "model.activation_checkpointing",
    "model.channels_last",
    "model.compile",
    "model.bn_neck",
    "model.ibn",
    "loss.teacher_cache",
    "head.fused_optimizer",
    "head.compile_tiles",
    "train.deterministic",
    "train.remap_classes",
    "eval.flip",
]


def run_config(*args: str):
    return CliRunner().invoke(main, ["config", *args])


@pytest.fixture
def base_config(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"train": {"output_dir": str(tmp_path / "run"), "batch_size": 8}}))
    return path


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def written_into(config: Path, overrides: list[str]) -> Path:
    """`config` with the overrides written into the file itself."""
    raw = yaml.safe_load(config.read_text())
    for override in overrides:
        apply_override(raw, override)
    config.write_text(yaml.safe_dump(raw))
    return config


@pytest.mark.parametrize("given", ["file", "--set"])
@pytest.mark.parametrize("overrides, key, shown", BAD_VALUES, ids=lambda v: str(v))
def test_each_bad_value_is_one_line_naming_where_it_was_given_key_and_value(
    base_config, overrides, key, shown, given
):
    """A value from the YAML names the file; one from --set names --set, where the user typed it."""
    if given == "file":
        line = one_error_line(run_config("-c", str(written_into(base_config, overrides))))
        assert line.startswith(f"error: config {base_config}: {key} = {shown}: "), line
    else:
        args = [arg for override in overrides for arg in ("--set", override)]
        line = one_error_line(run_config("-c", str(base_config), *args))
        assert line.startswith(f"error: --set: {key} = {shown}: "), line
    assert "Traceback" not in line


@pytest.mark.parametrize("key", BAD_TYPES)
def test_a_wrong_type_is_one_line(base_config, key):
    line = one_error_line(run_config("-c", str(base_config), "--set", f"{key}=maybe"))
    assert line == f"error: --set: {key} must be true or false, got 'maybe'"
    line = one_error_line(run_config("-c", str(written_into(base_config, [f"{key}=maybe"]))))
    assert line == f"error: config {base_config}: {key} must be true or false, got 'maybe'"


def test_a_value_set_under_a_section_or_in_a_list_names_set(base_config):
    line = one_error_line(run_config("-c", str(base_config), "--set", "train={steps: many}"))
    assert line == "error: --set: train.steps must be an integer, got 'many'"
    line = one_error_line(run_config("-c", str(base_config), "--set", "data.image_size=[112, x]"))
    assert line == "error: --set: data.image_size[1] must be an integer, got 'x'"
    line = one_error_line(run_config("-c", str(base_config), "--set", "train.bogus=1"))
    assert line.startswith("error: --set: unknown key train.bogus; valid keys here: ")


def test_every_field_declares_its_checks():
    """Booleans (null too: the device decides) are fully checked by their type; margin_params by the
    margin it belongs to."""
    unchecked = []

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            key = prefix + field.name
            if dataclasses.is_dataclass(hints[field.name]):
                walk(hints[field.name], key + ".")
            elif (
                hints[field.name] not in (bool, bool | None)
                and not field_checks(field)
                and key != "head.margin_params"
            ):
                unchecked.append(key)

    walk(Config, "")
    assert unchecked == []


def test_every_registry_a_check_names_exists():
    """Every registry a section's check names holds names, so no choice of a key is empty."""
    found = []

    def walk(cls):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[field.name]):
                walk(hints[field.name])
            for check in field_checks(field):
                if isinstance(check, Registered | RegisteredSuffix):
                    found.append(check.registry)
                    assert check.names(), f"{cls.__name__}.{field.name}"

    walk(Config)
    assert len(found) == 9 and len({id(registry) for registry in found}) == 9


def test_bad_values_cover_every_checked_field():
    named = {key for _, key, _ in BAD_VALUES} | set(BAD_TYPES) | {"head.margin_params"}
    every = []

    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[field.name]):
                walk(hints[field.name], prefix + field.name + ".")
            else:
                every.append(prefix + field.name)

    walk(Config, "")
    assert sorted(set(every) - named) == []


def shipped(path: Path):
    """A shipped config, skipped while the backbone it names is not in this tree (ms1mv3_mbf's `mbf`)."""
    backbone = (yaml.safe_load(path.read_text()).get("model") or {}).get("backbone")
    missing = backbone is not None and backbone not in BACKBONES
    return pytest.param(
        path, marks=pytest.mark.skipif(missing, reason=f"backbone {backbone!r} is not registered")
    )


SHIPPED = [shipped(path) for path in sorted((REPO / "configs").glob("*.yaml"))]


def stand_ins(config: Path, tmp: Path) -> dict[str, Path]:
    """A stand-in of the right kind (file or folder) in `tmp` for each path the config reads; each
    of a list of verification sets is `eval.pairs[i]`."""
    cfg = load_config(config)
    files = {"eval.pairs": cfg.eval.pairs} if isinstance(cfg.eval.pairs, str | None) else {
        f"eval.pairs[{index}]": named for index, named in enumerate(cfg.eval.pairs)
    }  # fmt: skip
    folders = {"eval.images": cfg.eval.images, "model.init": cfg.model.init}
    if cfg.data.source != "synthetic":
        (files if cfg.data.source in ("list", "recordio") else folders)["data.path"] = cfg.data.path
    made = {}
    for key, named in [*files.items(), *folders.items()]:
        if named is None:
            continue
        made[key] = tmp / key / Path(named).name
        made[key].parent.mkdir(parents=True)
        made[key].write_text("") if key in files else made[key].mkdir()
    return made


def set_args(paths: dict[str, Path]) -> list[str]:
    """--set options giving each path; the items of a list (`eval.pairs[i]`) as one list."""
    items: dict[str, list[str]] = {}
    args = []
    for key, path in paths.items():
        if key.endswith("]"):
            items.setdefault(key.partition("[")[0], []).append(str(path))
        else:
            args += ["--set", f"{key}={path}"]
    for key, values in items.items():
        args += ["--set", f"{key}={json.dumps(values)}"]  # JSON is YAML, and quotes the paths
    return args


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_validate_once_their_paths_exist(path, tmp_path):
    result = run_config("-c", str(path), *set_args(stand_ins(path, tmp_path)))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output)["train"]["output_dir"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_each_path_a_shipped_config_reads_is_checked_and_named(path, tmp_path):
    """Each missing path is one line naming its key, before anything runs; the run's own output folder
    and the synthetic set a run generates are not looked for."""
    made = stand_ins(path, tmp_path)
    for missing in made:
        absent = {**made, missing: tmp_path / "absent" / made[missing].name}
        line = one_error_line(run_config("-c", str(path), *set_args(absent)))
        assert line.startswith(f"error: --set: {missing} = '{tmp_path / 'absent'}"), line
        assert "does not exist" in line


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_name_only_paths_a_user_provides(path):
    """No path of this repository's development setup (../shared), which a user's clone lacks."""
    assert "../" not in path.read_text()


def test_a_missing_path_in_the_file_names_the_file_and_what_to_set(tmp_path):
    config = tmp_path / "lfw.yaml"
    config.write_text(yaml.safe_dump({"eval": {"pairs": "/data/lfw/pairs.txt"}}))
    line = one_error_line(run_config("-c", str(config)))
    assert line == (
        f"error: config {config}: eval.pairs = '/data/lfw/pairs.txt': does not exist; set eval.pairs=null "
        "or give the file"
    )
    folder = tmp_path / "faces"
    folder.write_text("not a folder")
    line = one_error_line(
        run_config("-c", str(config), "--set", f"data.path={folder}", "--set", "data.source=folder")
    )
    assert line == (
        f"error: --set: data.path = '{folder}': is not a folder; data.source 'folder' reads a folder of "
        "root/<identity>/<image>"
    )


def test_pairs_inside_the_synthetic_set_a_run_generates_are_not_looked_for(tmp_path):
    overrides = [
        f"data.path={tmp_path / 'synth'}",
        f"eval.pairs={tmp_path / 'synth' / 'heldout' / 'pairs.txt'}",
    ]
    validate(load_config(overrides=overrides))
    (tmp_path / "synth" / "train").mkdir(parents=True)  # the set exists, without its pairs
    with pytest.raises(FacetrainError, match=r"^--set: eval.pairs = .*: does not exist"):
        validate(load_config(overrides=overrides), given={"eval.pairs": "--set"})


def test_world_size_rule_runs_when_the_world_size_is_known(base_config):
    args = ["-c", str(base_config), "--set", "parallel.pipeline_stages=3", "--set", "parallel.microbatches=4"]
    assert run_config(*args, "--set", "train.batch_size=12").exit_code == 0
    line = one_error_line(run_config(*args, "--set", "train.batch_size=12", "--world-size", "4"))
    assert line == (
        "error: --set: parallel.pipeline_stages = 3: must divide the world size 4 (world = stages x replicas)"
    )
    assert run_config(*args, "--set", "train.batch_size=12", "--world-size", "6").exit_code == 0


def test_cuda_only_settings_need_a_cuda_device():
    fp16 = load_config(overrides=["train.precision=fp16"])
    validate(fp16)
    validate(fp16, device_type="cuda")
    with pytest.raises(FacetrainError, match=r"^config defaults: train.precision = 'fp16': needs CUDA"):
        validate(fp16, source="defaults", device_type="cpu")
    nccl = load_config(overrides=["parallel.backend=nccl"])
    with pytest.raises(FacetrainError, match=r"^config: parallel.backend = 'nccl': needs CUDA"):
        validate(nccl, device_type="cpu")


def test_an_output_dir_that_is_a_file_or_under_one_is_refused(base_config, tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    line = one_error_line(run_config("-c", str(base_config), "--set", f"train.output_dir={blocker}"))
    assert line == f"error: --set: train.output_dir = '{blocker}': is a file; choose a folder"
    line = one_error_line(run_config("-c", str(base_config), "--set", f"train.output_dir={blocker}/run"))
    assert f"lies under {blocker}, which is a file" in line
    assert blocker.read_text() == "mine"


def test_an_output_dir_in_the_training_data_is_refused(base_config, tmp_path):
    data = tmp_path / "faces"
    (data / "alice").mkdir(parents=True)
    for output_dir, where in ((data, "is data.path"), (data / "run", "lies in data.path")):
        overrides = ["--set", f"data.path={data}", "--set", f"train.output_dir={output_dir}"]
        line = one_error_line(run_config("-c", str(base_config), *overrides))
        assert line == (
            f"error: --set: train.output_dir = '{output_dir}': {where} ({data}), and the "
            "run's files would become part of the dataset; choose a folder outside the data"
        )
    assert sorted(p.name for p in data.iterdir()) == ["alice"]
    beside = ["--set", f"data.path={data}", "--set", f"train.output_dir={tmp_path / 'faces_run'}"]
    assert run_config("-c", str(base_config), *beside).exit_code == 0


def test_home_is_expanded_in_every_path_and_saved_expanded(base_config, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    paths = {
        "data.path": "~/faces",
        "train.output_dir": "~/runs/x",
        "eval.pairs": "~/lfw/pairs.txt",
        "eval.images": "~/lfw/images",
    }
    (tmp_path / "home" / "faces").mkdir(parents=True)
    (tmp_path / "home" / "lfw" / "images").mkdir(parents=True)
    (tmp_path / "home" / "lfw" / "pairs.txt").write_text("1\t1\n")
    args = [arg for key, value in paths.items() for arg in ("--set", f"{key}={value}")]
    result = run_config("-c", str(base_config), "--set", "data.source=folder", *args)
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.output)
    for key, value in paths.items():
        section, name = key.split(".")
        assert printed[section][name] == str(tmp_path / "home" / value[2:])


def test_a_python_tag_is_one_line_with_the_line_number_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    config = tmp_path / "evil.yaml"
    config.write_text(f"train:\n  steps: 5\n  seed: !!python/object/apply:os.system ['touch {marker}']\n")
    line = one_error_line(run_config("-c", str(config)))
    assert line.startswith(
        f"error: config {config} line 3: not valid YAML: could not determine a constructor"
    )
    assert "!!python" in line
    assert not marker.exists()


def test_validate_names_no_file_when_none_is_given():
    with pytest.raises(FacetrainError, match=r"^config: train.steps = 0: must be in \[1, 1000000000\]$"):
        validate(load_config(overrides=["train.steps=0"]))


def test_exponent_numbers_without_a_dot_are_numbers(tmp_path):
    """YAML 1.1 reads 5e-3 as a string; in a number field it is the number a user meant."""
    path = tmp_path / "config.yaml"
    path.write_text("optim:\n  lr: 1e-3\n")
    cfg = load_config(path, ["optim.weight_decay=5e-3", "head.scale=+3E1"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.head.scale) == (0.001, 0.005, 30.0)
    with pytest.raises(FacetrainError, match="optim.lr must be a number, got '1e-3x'"):
        load_config(None, ["optim.lr=1e-3x"])


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        (
            "train.batch_size=99999999999999999999",
            "train.batch_size = 99999999999999999999: must be in [1, 1048576]",
        ),
        ("parallel.timeout_s=1e308", "parallel.timeout_s = 1e+308: must be in (0, 2592000]"),
    ],
)
def test_absurd_sizes_and_timeouts_are_refused_by_the_launcher_before_any_rank_starts(
    tmp_path, override, allowed
):
    """Before, the batch size overflowed inside the ranks (a traceback) and the timeout made the
    `--nproc 2` launcher exit with no message at all."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"train": {"output_dir": str(tmp_path / "run")}}))
    result = run_cli("train", "-c", str(config), "--set", override, "--nproc", "2")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: --set: {allowed}"
    assert not (tmp_path / "run").exists()


def test_a_list_of_pairs_files_is_checked_file_by_file(base_config):
    long_part = "x" * 300
    line = one_error_line(
        run_config("-c", str(base_config), "--set", f"eval.pairs=[a.csv, {long_part}/b.csv]")
    )
    assert line.startswith("error: --set: eval.pairs = "), line
    assert "a path part of 300 bytes is longer than a file name may be (255)" in line
