"""`facetrain outliers`: a run's own head ranks the images mislabelled before training at the top of its
report, with one centre a class and with sub-centers; what it cannot read or would overwrite is one
line; its scores match a plain reference."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from facetrain.cli import main
from facetrain.train.outliers import COLUMNS, FAR, NEARER_OTHER, NON_DOMINANT, score_images
from tests.support.train_helpers import run_cli, tiny_config

IDENTITIES, IMAGES = 8, 8
MISLABELLED = {0: 1, 2: 3, 4: 5}  # the first image of identity A moved into identity B's folder


def _separable_faces(root: Path) -> list[Path]:
    """Identities a small backbone tells apart in a few dozen steps (a coarse random pattern each, every
    image with its own pixel noise), with a few images moved into another identity's folder; the paths
    of those."""
    rng = np.random.default_rng(0)
    for identity in range(IDENTITIES):
        pattern = rng.integers(0, 256, (4, 4, 3)).astype(np.uint8)
        pattern = cv2.resize(pattern, (32, 32), interpolation=cv2.INTER_NEAREST).astype(np.float64)
        (root / f"id{identity}").mkdir(parents=True)
        for index in range(IMAGES):
            image = np.clip(pattern + rng.normal(0, 12, pattern.shape), 0, 255).astype(np.uint8)
            cv2.imwrite(str(root / f"id{identity}" / f"{index}.png"), image)
    moved = []
    for source, target in MISLABELLED.items():
        moved.append(root / f"id{target}" / f"from_id{source}.png")
        (root / f"id{source}" / "0.png").rename(moved[-1])
    return moved


@pytest.fixture(scope="module", params=[1, 3], ids=["K1", "K3"])
def noisy_run(request, tmp_path_factory) -> tuple[Path, list[Path], int]:
    """A tiny run trained on the mislabelled set with `head.sub_centers` K: (its directory, the
    mislabelled images, K)."""
    tmp = tmp_path_factory.mktemp(f"outliers_k{request.param}")
    moved = _separable_faces(tmp / "faces")
    config = tiny_config(
        tmp,
        "run",
        data={"source": "folder", "path": str(tmp / "faces")},
        head={"sub_centers": request.param},
        train={"steps": 60},
        checkpoint={"every": 60},
    )
    result = run_cli("train", "-c", str(config), "-q")
    assert result.returncode == 0, result.stderr
    (tmp / "faces" / "id7" / "broken.png").write_bytes(b"not an image")  # broken since training
    return tmp / "run", moved, request.param


def _read_report(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        assert tuple(reader.fieldnames) == COLUMNS
        return list(reader)


def test_the_mislabelled_images_top_the_report(noisy_run):
    run, moved, sub_centers = noisy_run
    earlier = run / "outliers.csv"
    earlier.write_text("mine\n")
    refused = CliRunner().invoke(main, ["outliers", str(run), "-q"])
    assert refused.exit_code == 2
    assert refused.stderr == f"error: {earlier} already exists; pass --overwrite to replace it\n"
    assert earlier.read_text() == "mine\n"
    result = run_cli("outliers", str(run), "--overwrite", "-q")
    assert result.returncode == 0, result.stderr
    unreadable, *rows = _read_report(run / "outliers.csv")
    assert Path(unreadable["path"]).name == "broken.png" and unreadable["reason"].startswith("unreadable: ")
    assert unreadable["identity"] == "id7" and unreadable["cosine"] == ""
    assert "unreadable: 1 image" in result.stdout.splitlines()
    assert len(rows) == IDENTITIES * IMAGES
    assert {Path(row["path"]) for row in rows[: len(moved)]} == set(moved)
    for row in rows[: len(moved)]:
        assert row["identity"] == Path(row["path"]).parent.name and row["reason"]
        assert row["other_identity"] not in ("", row["identity"])
        assert float(row["other_cosine"]) > float(row["dominant_cosine"])
        assert float(row["dominant_angle"]) == pytest.approx(
            math.degrees(math.acos(float(row["dominant_cosine"]))), abs=0.06
        )
        assert sub_centers > 1 or row["sub_center"] == row["dominant_sub_center"] == "0"
    flagged = [row for row in rows if row["reason"]]
    assert rows[: len(flagged)] == flagged  # every flagged image before every other
    for reason in (NON_DOMINANT, FAR, NEARER_OTHER):
        count = sum(reason in row["reason"].split("; ") for row in rows)
        line = f"{reason}: {count} images"
        assert (line in result.stdout.splitlines()) == (count > 0), (line, result.stdout)
    assert sub_centers > 1 or not any(NON_DOMINANT in row["reason"] for row in rows)
    assert f"{len(flagged) + 1} of {IDENTITIES * IMAGES + 1} images flagged" in result.stdout
    assert all(path.is_file() for path in moved)  # nothing moved or deleted


def test_what_is_not_a_trained_run_is_one_line(tmp_path):
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(main, ["outliers", str(missing)])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {missing} does not exist; pass a training run directory or one of its checkpoints\n"
    )
    empty = tmp_path / "empty_run"
    (empty / "checkpoints").mkdir(parents=True)
    result = CliRunner().invoke(main, ["outliers", str(empty)])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith(f"error: no checkpoint at {empty}")


def _reference_scores(embeddings, labels, weight, sub_centers):
    """Image by image and centre by centre in float64: the definitions the report documents."""
    centres = weight.reshape(len(weight), sub_centers, -1)
    centres = centres / np.linalg.norm(centres, axis=2, keepdims=True)
    cos = np.einsum("nd,ckd->nck", embeddings, centres)
    nearest = [int(np.argmax(cos[i, labels[i]])) for i in range(len(labels))]
    dominant_of = {}
    for label in set(labels.tolist()):
        picks = [nearest[i] for i in range(len(labels)) if labels[i] == label]
        dominant_of[label] = max(range(sub_centers), key=lambda k: (picks.count(k), -k))
    rows = []
    for i, label in enumerate(labels):
        others = [(cos[i, c].max(), c) for c in range(len(weight)) if c != label]
        other_cosine, other = max(others, key=lambda pair: (pair[0], -pair[1]))
        dominant = dominant_of[int(label)]
        rows.append((cos[i, label].max(), nearest[i], dominant, cos[i, label, dominant], other, other_cosine))
    return rows


@pytest.mark.parametrize("sub_centers", [1, 3])
def test_scores_match_a_plain_reference(sub_centers, monkeypatch):
    classes, dim, images = 5, 6, 23
    monkeypatch.setattr("facetrain.train.outliers.COSINES_A_CHUNK", 7 * classes * sub_centers)  # 4 chunks
    generator = torch.Generator().manual_seed(sub_centers)
    weight = torch.randn(classes, sub_centers * dim, generator=generator, dtype=torch.float64)
    embeddings = torch.nn.functional.normalize(
        torch.randn(images, dim, generator=generator, dtype=torch.float64)
    )
    labels = torch.randint(0, classes, (images,), generator=generator)
    scores = score_images(embeddings, labels, weight, sub_centers)
    expected = _reference_scores(embeddings.numpy(), labels.numpy(), weight.numpy(), sub_centers)
    for i, (cosine, nearest, dominant, dominant_cosine, other, other_cosine) in enumerate(expected):
        assert scores.label[i] == labels[i]
        assert scores.cosine[i] == pytest.approx(cosine, abs=1e-12)
        assert (scores.sub_center[i], scores.dominant[i], scores.other[i]) == (nearest, dominant, other)
        assert scores.dominant_cosine[i] == pytest.approx(dominant_cosine, abs=1e-12)
        assert scores.other_cosine[i] == pytest.approx(other_cosine, abs=1e-12)
    reasons = scores.reasons(75.0, sub_centers)
    for i, row in enumerate(expected):
        assert (NON_DOMINANT in reasons[i]) == (sub_centers > 1 and row[1] != row[2])
        assert (FAR in reasons[i]) == (row[3] < math.cos(math.radians(75.0)))
        assert (NEARER_OTHER in reasons[i]) == (row[5] > row[0])
