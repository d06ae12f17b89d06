"""`facetrain export`, `embed` and `compare` through the command line, on an exported fresh backbone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.eval.embedding import EmbedSettings, embed_images
from facetrain.export.exporter import export_loaded
from facetrain.interop.loading import load_model
from tests.support.small_models import fresh_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("model")
    export_loaded(fresh_model(), out, formats=["safetensors"], progress=False)
    return out


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five random colour images in two nested folders, larger than the model input to exercise resizing."""
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for index in range(5):
        folder = root / ("a" if index < 3 else "b/c")
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{index}.png"), rng.integers(0, 256, (40, 36, 3), dtype=np.uint8))
    return root


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(arg) for arg in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("command", ["export", "embed", "compare"])
def test_help_shows_examples(command: str) -> None:
    code, output = run(command, "--help")
    assert code == 0
    assert "Examples:" in output
    assert f"facetrain {command} " in output


def test_embed_npy_matches_embedding_the_images_directly(
    model_dir: Path, image_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "vectors.npy"
    code, output = run("embed", model_dir, image_dir, "-o", out, "--batch-size", "2", "--no-flip")
    assert code == 0, output
    vectors = np.load(out)
    names = (tmp_path / "vectors.paths.txt").read_text().splitlines()
    expected_names = sorted(str(path) for path in image_dir.rglob("*.png"))
    assert names == expected_names
    model = load_model(model_dir)
    expected = embed_images(
        model.module, expected_names, EmbedSettings(model.image_size, flip=False, progress=False)
    )
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_embed_csv_has_a_path_column_and_one_column_per_dimension(
    model_dir: Path, image_dir: Path, tmp_path: Path
) -> None:
    first = sorted((image_dir / "a").glob("*.png"))[0]
    out = tmp_path / "vectors.csv"
    code, output = run("embed", model_dir, first, image_dir / "b", "-o", out)
    assert code == 0, output
    table = pd.read_csv(out)
    assert list(table["path"]) == [str(first), str(image_dir / "b/c/3.png"), str(image_dir / "b/c/4.png")]
    assert list(table.columns[1:]) == [f"e{index}" for index in range(load_model(model_dir).embedding_size)]
    np.testing.assert_allclose(np.linalg.norm(table.iloc[:, 1:].to_numpy(), axis=1), 1.0, atol=1e-5)


def raw_norms(model_dir: Path, names: list[str]) -> np.ndarray:
    """The norms of the model's embeddings of `names` before normalisation, computed here directly."""
    from facetrain.data.decode import decode_image
    from facetrain.data.transforms import build_eval_transform

    model = load_model(model_dir)
    transform = build_eval_transform(model.image_size)
    images = torch.stack([transform(decode_image(name)) for name in names])
    with torch.no_grad():
        return model.module.eval()(images).float().norm(dim=1).numpy()


def test_embed_norms_writes_each_images_raw_norm(model_dir: Path, image_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "vectors.npy"
    code, output = run("embed", model_dir, image_dir, "-o", out, "--norms", "--batch-size", "2")
    assert code == 0, output
    names = (tmp_path / "vectors.paths.txt").read_text().splitlines()
    norms = np.load(tmp_path / "vectors.norms.npy")
    assert norms.shape == (len(names),) and str(tmp_path / "vectors.norms.npy") in output
    # the image's own norm (no mirror added, whatever --flip), not the unit vectors' 1
    np.testing.assert_allclose(norms, raw_norms(model_dir, names), rtol=1e-5)
    assert not np.allclose(norms, 1.0)
    table_out = tmp_path / "vectors.csv"
    code, output = run("embed", model_dir, image_dir, "-o", table_out, "--norms", "--no-flip")
    assert code == 0, output
    table = pd.read_csv(table_out)
    assert list(table.columns[:3]) == ["path", "norm", "e0"]
    np.testing.assert_allclose(table["norm"].to_numpy(), norms, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(table.iloc[:, 2:].to_numpy(), axis=1), 1.0, atol=1e-5)
    plain = tmp_path / "plain.npy"
    assert run("embed", model_dir, image_dir, "-o", plain)[0] == 0
    assert not (tmp_path / "plain.norms.npy").exists()


def test_embed_norms_of_a_model_normalising_inside_says_so(
    model_dir: Path, image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every norm 1: the norms are written as asked, and a note says they tell nothing of quality."""
    import facetrain.interop.loading as loading

    real = loading.load_model

    class Normalising(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module):
            super().__init__()
            self.inner = inner

        def forward(self, images):
            return torch.nn.functional.normalize(self.inner(images), dim=1)

    def normalising_model(*args):
        loaded = real(*args)
        return dataclasses.replace(loaded, module=Normalising(loaded.module))

    monkeypatch.setattr(loading, "load_model", normalising_model)
    out = tmp_path / "vectors.npy"
    code, output = run("embed", model_dir, image_dir, "-o", out, "--norms")
    assert code == 0, output
    np.testing.assert_allclose(np.load(tmp_path / "vectors.norms.npy"), 1.0, atol=1e-5)
    assert f"note: every norm is 1: {model_dir} normalises its embedding inside" in output
    code, output = run("embed", model_dir, image_dir, "-o", tmp_path / "plain.npy")
    assert code == 0 and "note:" not in output  # without --norms, nothing to say


def test_embed_parquet_without_pyarrow_suggests_npy_or_csv(
    model_dir: Path, image_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *args: None)
    code, output = run("embed", model_dir, image_dir, "-o", tmp_path / "vectors.parquet")
    assert code == 2
    assert "error:" in output and "pyarrow" in output and ".csv" in output
    assert not (tmp_path / "vectors.parquet").exists()


def test_embed_refuses_existing_output_and_bad_inputs(
    model_dir: Path, image_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "mine.csv"
    out.write_text("precious\n")
    code, output = run("embed", model_dir, image_dir, "-o", out)
    assert code == 2 and "--overwrite" in output
    assert out.read_text() == "precious\n"
    code, output = run("embed", model_dir, tmp_path / "missing.jpg", "-o", tmp_path / "x.npy")
    assert code == 2 and "does not exist" in output
    code, output = run("embed", model_dir, image_dir, "-o", tmp_path / "x.txt")
    assert code == 2 and "unknown format" in output


def test_compare_uses_the_cards_threshold_or_the_given_one(model_dir: Path, image_dir: Path) -> None:
    first, second = sorted((image_dir / "a").glob("*.png"))[:2]
    code, output = run("compare", model_dir, first, first)
    assert code == 0, output
    assert "similarity 1.0000" in output and "threshold 0.3500" in output and "same person" in output
    code, output = run("compare", model_dir, first, second, "--threshold", "1.01")
    assert code == 0, output
    similarity = float(output.split()[1])
    assert -1.0 <= similarity <= 1.0
    assert "threshold 1.0100" in output and "different people" in output


def test_compare_of_images_not_at_the_input_size_suggests_align(model_dir: Path, tmp_path: Path) -> None:
    """Crops at the model's input size are taken as aligned; anything else gets a one-line note on
    stderr that the model expects aligned crops (a raw photo's low score is not the model's verdict)."""
    from tests.support.small_models import IMAGE_SIZE

    rng = np.random.default_rng(1)
    crop, photo = tmp_path / "crop.png", tmp_path / "photo.png"
    cv2.imwrite(str(crop), rng.integers(0, 256, (*IMAGE_SIZE, 3), dtype=np.uint8))
    cv2.imwrite(str(photo), rng.integers(0, 256, (90, 70, 3), dtype=np.uint8))
    code, output = run("compare", model_dir, crop, crop)
    assert code == 0 and "note:" not in output
    code, output = run("compare", model_dir, crop, photo)
    assert code == 0 and f"note: {photo} is 70x90, not the model's" in output and "--align" in output


def test_compare_without_any_threshold_is_a_user_error(image_dir: Path, tmp_path: Path) -> None:
    export_loaded(fresh_model(threshold=None), tmp_path, formats=["safetensors"], progress=False)
    image = next(image_dir.rglob("*.png"))
    code, output = run("compare", tmp_path, image, image)
    assert code == 2
    assert "error:" in output and "--threshold" in output


def test_export_command_reexports_an_export_and_checks_onnx(model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    out = tmp_path / "again"
    code, output = run("export", model_dir, "-o", out, "--formats", "onnx,torchscript", "--quiet")
    assert code == 0, output
    assert "model.onnx" in output and "max |diff|" in output
    card = json.loads((out / "model.json").read_text())
    assert set(card["files"]) == {"onnx", "torchscript"}
    assert card["threshold"] == json.loads((model_dir / "model.json").read_text())["threshold"]
    code, output = run("export", model_dir, "-o", out, "--formats", "onnx")
    assert code == 2 and "--overwrite" in output


def test_the_old_model_option_still_works_with_a_notice(
    model_dir: Path, image_dir: Path, tmp_path: Path
) -> None:
    """`-m MODEL` of the last release, anywhere among the arguments, is MODEL first, with a notice."""
    first, second = sorted(image_dir.rglob("*.png"))[:2]
    runner = CliRunner()
    new = runner.invoke(main, ["compare", str(model_dir), str(first), str(second)])
    old = runner.invoke(main, ["compare", str(first), str(second), "-m", str(model_dir)])
    assert old.exit_code == new.exit_code == 0 and old.stdout == new.stdout
    notice = old.stderr.splitlines()[0]
    assert notice == (
        "note: `facetrain compare ... -m MODEL` is the old spelling, kept for this release only; "
        "write `facetrain compare MODEL IMG1 IMG2`"
    )
    old = runner.invoke(
        main, ["embed", str(image_dir), f"--model={model_dir}", "-o", str(tmp_path / "x.npy")]
    )
    assert old.exit_code == 0 and (tmp_path / "x.npy").is_file()
    assert old.stderr.startswith("note: `facetrain embed ... -m MODEL` is the old spelling")
