"""`facetrain import insightface`: a trained IResNet saved as a plain backbone.pth comes back identical,
every other command takes the result, and bad files are one-line errors that write nothing."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections import OrderedDict
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch import nn

from facetrain.checkpoint import read_meta, resolve_checkpoint
from facetrain.cli import main
from facetrain.errors import FacetrainError
from facetrain.eval.embedding import EmbedSettings, embed_images
from facetrain.eval.pairs import load_pairs
from facetrain.eval.set_names import report_file_name
from facetrain.eval.verify_pairs import verify
from facetrain.export.exporter import export_model
from facetrain.interop.insightface_import import import_insightface, read_backbone_state
from facetrain.interop.loading import load_model
from facetrain.models import build_backbone
from facetrain.models.config import ModelConfig
from facetrain.train.run_config import checkpoint_config

ARCH = "iresnet18"
EMBEDDING_SIZE = 32
SIZE = (112, 112)


def run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path]:
    """An iresnet18 after a few SGD steps (weights and BN statistics moved), saved the way insightface's
    arcface_torch saves backbone.pth: torch.save of the bare state dict."""
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(backbone=ARCH, embedding_size=EMBEDDING_SIZE), SIZE)
    classifier = nn.Linear(EMBEDDING_SIZE, 2)
    optimizer = torch.optim.SGD([*backbone.parameters(), *classifier.parameters()], lr=0.1, momentum=0.9)
    images, labels = torch.rand(4, 3, *SIZE) * 2 - 1, torch.tensor([0, 1, 0, 1])
    for _ in range(2):
        optimizer.zero_grad()
        nn.functional.cross_entropy(classifier(backbone(images)), labels).backward()
        optimizer.step()
    assert int(backbone.bn1.num_batches_tracked) == 2
    path = tmp_path_factory.mktemp("insightface") / "backbone.pth"
    torch.save(backbone.state_dict(), path)
    return backbone.eval(), path


@pytest.fixture(scope="module")
def face_images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("faces")
    rng = np.random.default_rng(0)
    paths = []
    for index in range(4):
        paths.append(root / f"{index}.png")
        cv2.imwrite(str(paths[-1]), rng.integers(0, 256, (*SIZE, 3), dtype=np.uint8))
    return paths


@pytest.fixture(scope="module")
def imported(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imported") / "r18"
    code, output = run("import", "insightface", trained[1], "--arch", ARCH, "-o", out, "--quiet")
    assert code == 0, output
    assert f"as {ARCH}" in output and str(out) in output
    return out


def test_help_shows_examples():
    code, output = run("import", "insightface", "--help")
    assert code == 0 and "Examples:" in output and "facetrain import insightface " in output


def test_trained_backbone_pth_imports_back_to_identical_embeddings(trained, imported, face_images):
    original, source = trained
    backbone = load_model(imported).module
    meta = read_meta(resolve_checkpoint(imported))
    config = checkpoint_config(resolve_checkpoint(imported))
    assert (config.model.backbone, config.model.embedding_size, config.data.image_size) == (
        ARCH,
        EMBEDDING_SIZE,
        list(SIZE),
    )
    for key, tensor in original.state_dict().items():
        assert torch.equal(backbone.state_dict()[key], tensor), key
    images = torch.rand(3, 3, *SIZE) * 2 - 1
    with torch.no_grad():
        expected, actual = original(images), backbone(images)
    assert (actual - expected).abs().max() <= 1e-6 * max(1.0, float(expected.abs().max()))
    normalized = [
        embed_images(m, face_images, EmbedSettings(SIZE, progress=False)) for m in (original, backbone)
    ]
    assert np.abs(normalized[0] - normalized[1]).max() <= 1e-6
    assert meta["num_classes"] == 0 and meta["step"] == 0
    assert meta["imported_from"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert json.loads((imported / "classes.json").read_text()) == []


def test_embed_compare_and_export_take_the_import(trained, imported, face_images, tmp_path):
    original = trained[0]
    expected = embed_images(original, face_images, EmbedSettings(SIZE, progress=False))

    code, output = run("embed", imported, *face_images, "-o", tmp_path / "faces.npy")
    assert code == 0, output
    np.testing.assert_allclose(np.load(tmp_path / "faces.npy"), expected, atol=1e-6, rtol=0)

    code, output = run("compare", imported, face_images[0], face_images[1], "--threshold", "0.5")
    assert code == 0, output
    assert f"similarity {float(expected[0] @ expected[1]):.4f}" in output

    export_model(imported, tmp_path / "export", formats=["safetensors"], progress=False)
    exported = load_model(tmp_path / "export")
    assert exported.card["architecture"] == ARCH
    assert exported.card["input"]["normalization"]["scale"] == 127.5
    reloaded = embed_images(exported.module, face_images, EmbedSettings(SIZE, progress=False))
    np.testing.assert_allclose(reloaded, expected, atol=1e-6, rtol=0)


def test_eval_scores_an_insightface_pack_with_the_import(trained, imported, tmp_path):
    """An insightface-style .bin (cv2.imencode arrays, 10 pairs in 10 folds) through `facetrain eval`."""
    rng = np.random.default_rng(1)
    people = [rng.integers(0, 256, (*SIZE, 3), dtype=np.uint8) for _ in range(6)]

    def photo(person: int) -> np.ndarray:
        noisy = people[person].astype(np.int16) + rng.integers(-20, 21, (*SIZE, 3))
        return cv2.imencode(".png", noisy.clip(0, 255).astype(np.uint8))[1]

    encoded, issame = [], []
    for index in range(10):
        same = index % 2 == 0
        first = index % len(people)
        encoded += [photo(first), photo(first if same else (first + 1) % len(people))]
        issame.append(same)
    pack = tmp_path / "pack.bin"
    pack.write_bytes(pickle.dumps((encoded, issame), protocol=pickle.HIGHEST_PROTOCOL))

    code, output = run(
        "eval", imported, "--pairs", pack, "--no-flip", "--out", tmp_path / "report", "--quiet"
    )
    assert code == 0, output
    report = json.loads((tmp_path / "report" / f"{report_file_name(pack)}.json").read_text())
    reference = verify(load_pairs(pack), trained[0], EmbedSettings(SIZE, flip=False, progress=False))
    expected = reference.as_dict()
    assert report["num_pairs"] == 10 and report["folds_source"] == expected["folds_source"]
    for figure in ("accuracy", "auc", "eer", "threshold", "xnorm"):
        assert report[figure] == pytest.approx(expected[figure], abs=1e-5), figure


@pytest.mark.parametrize("wrapper", ["state_dict", "model", "state_dict_backbone", "ddp"])
def test_common_wrappers_unwrap_to_the_same_state(trained, tmp_path, wrapper):
    state = trained[0].state_dict()
    content = {
        "state_dict": {"state_dict": state, "epoch": 3},
        "model": {"model": state, "optimizer": {"lr": 0.1}},
        "state_dict_backbone": {"epoch": 20, "global_step": 100, "state_dict_backbone": state},
        "ddp": OrderedDict((f"module.{key}", value) for key, value in state.items()),
    }[wrapper]
    path = tmp_path / "wrapped.pth"
    torch.save(content, path)
    unwrapped = read_backbone_state(path)
    assert list(unwrapped) == list(state)
    assert all(torch.equal(unwrapped[key], value) for key, value in state.items())


def _without(state, key):
    return {k: v for k, v in state.items() if k != key}


KEY_ERRORS = {
    "missing": (lambda s: _without(s, "layer2.1.bn3.running_var"), r"missing 'layer2\.1\.bn3\.running_var'"),
    "unexpected": (lambda s: {**s, "head.weight": torch.zeros(2)}, r"unexpected 'head\.weight'"),
    "shape": (
        lambda s: {**s, "conv1.weight": torch.zeros(64, 3, 5, 5)},
        r"'conv1\.weight' has shape \[64, 3, 5, 5\], iresnet18 needs \[64, 3, 3, 3\]",
    ),
    "not a tensor": (lambda s: {**s, "prelu.weight": [0.25] * 64}, r"entry 'prelu\.weight' is a list"),
    "all NaN": (
        lambda s: {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in s.items()},
        r"entry 'conv1\.weight' holds 1728 NaN or infinite values of 1728; the file comes from a diverged run",
    ),
    "one inf": (
        lambda s: {**s, "fc.weight": s["fc.weight"].index_fill(0, torch.tensor([0]), float("inf"))},
        r"entry 'fc\.weight' holds \d+ NaN or infinite values of",
    ),
    "int64": (
        lambda s: {k: v.long() for k, v in s.items()},
        r"entry 'conv1\.weight' holds int64 values, not floating-point weights",
    ),
    "0-row fc": (
        lambda s: {**s, "fc.weight": s["fc.weight"][:0]},
        r"backbone\.pth: 'fc\.weight' has 0 rows",
    ),
    "partial prefix": (
        lambda s: {("module." + k if k.startswith("fc.") else k): v for k, v in s.items()},
        r"no 2-D 'fc\.weight' entry",
    ),
}


@pytest.mark.parametrize("case", list(KEY_ERRORS))
def test_key_and_shape_mismatches_name_the_first_one(trained, tmp_path, case):
    mutate, message = KEY_ERRORS[case]
    path = tmp_path / "backbone.pth"
    torch.save(mutate(trained[0].state_dict()), path)
    out = tmp_path / "out"
    with pytest.raises(FacetrainError, match=message) as error:
        import_insightface(path, ARCH, out, progress=False)
    assert "\n" not in str(error.value) and not out.exists()


def test_another_depth_is_named_with_the_arch_to_pass(trained, tmp_path):
    code, output = run(
        "import", "insightface", trained[1], "--arch", "iresnet34", "-o", tmp_path / "o", "--quiet"
    )
    assert code == 2
    assert output.count("\n") == 1 and output.startswith("error: ")
    assert "missing 'layer1.2.bn1.weight'" in output
    assert "(2, 2, 2, 2) blocks, which is iresnet18: pass --arch iresnet18" in output


class CreatesFileWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_files_that_are_not_weights_are_refused_without_running_anything(tmp_path):
    marker = tmp_path / "pwned"
    cases = {
        "module.pth": (nn.Linear(2, 2), r"refused: it pickles torch\.nn\.modules\.linear\.Linear"),
        "evil.pth": (
            {"fc.weight": CreatesFileWhenUnpickled(marker)},
            r"refused: it pickles (posix|nt|os)\.system",
        ),
        "list.pth": ([torch.zeros(2)], "holds a list, not a state dict"),
        "plain.pkl": (
            {"fc.weight": CreatesFileWhenUnpickled(marker)},
            r"plain\.pkl: not a weights-only PyTorch file \(a plain pickle, .*\), so it was not loaded and "
            r"nothing in it ran; save `model\.state_dict\(\)` with torch\.save and import that$",
        ),
        "empty.pth": ({"epoch": 3}, r"holds no state dict: .*keys found: 'epoch'"),
    }
    for name, (content, message) in cases.items():
        if name.endswith(".pkl"):  # pickle.dump, not torch.save
            (tmp_path / name).write_bytes(pickle.dumps(content))
        else:
            torch.save(content, tmp_path / name)
        with pytest.raises(FacetrainError, match=message) as refused:
            import_insightface(tmp_path / name, ARCH, tmp_path / "out", progress=False)
        assert "Re-running" not in str(refused.value) and "\n" not in str(refused.value)
    (tmp_path / "junk.pth").write_bytes(b"not a torch file")
    with pytest.raises(FacetrainError, match="junk.pth: not a"):
        import_insightface(tmp_path / "junk.pth", ARCH, tmp_path / "out", progress=False)
    with pytest.raises(FacetrainError, match="does not exist"):
        import_insightface(tmp_path / "absent.pth", ARCH, tmp_path / "out", progress=False)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_output_is_replaced_only_when_asked_and_only_if_it_is_a_checkpoint(trained, imported, tmp_path):
    source = trained[1]
    code, output = run("import", "insightface", source, "--arch", ARCH, "-o", imported, "--quiet")
    assert code == 2 and "already exists; pass --overwrite" in output

    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("keep me")
    with pytest.raises(FacetrainError, match="is not an earlier import"):
        import_insightface(source, ARCH, user_dir, overwrite=True, progress=False)
    assert (user_dir / "notes.txt").read_text() == "keep me"

    copy = tmp_path / "copy"
    import_insightface(source, ARCH, copy, progress=False)
    stamp = json.loads((copy / "meta.json").read_text())
    (copy / "meta.json").write_text(json.dumps({**stamp, "saved_at": "earlier"}))
    import_insightface(source, ARCH, copy, overwrite=True, progress=False)
    assert json.loads((copy / "meta.json").read_text())["saved_at"] != "earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy", "mine"], "no temporary directories left"
