"""Several verification sets during training, as insightface validates on lfw, cfp_fp and agedb_30 at
once: `eval.pairs` as a list, one console line per set, the table at the end, best/ by `eval.best_by`."""

from __future__ import annotations

import csv
import json
import pickle
from pathlib import Path

import cv2
import numpy as np
import pytest

from facetrain.errors import FacetrainError
from facetrain.eval.pairs import load_pairs
from facetrain.parallel.dims import init_parallel
from facetrain.train.evaluation import (
    TrainingVerifier,
    best_step,
    final_table,
    read_history,
    report_lines,
    tensorboard_scalars,
)
from facetrain.train.run_checks import validate
from facetrain.train.run_config import load_config
from tests.support.eval_sets import write_lfw_style_set
from tests.support.train_helpers import run_cli, tiny_config


def config_error(*overrides: str) -> str:
    with pytest.raises(FacetrainError) as caught:
        validate(load_config(None, list(overrides)))
    return str(caught.value)


def test_eval_pairs_takes_one_file_or_a_list(tmp_path: Path):
    files = [tmp_path / name for name in ("lfw.bin", "cfp_fp.bin", "agedb_30.bin")]
    for path in files:
        path.write_bytes(b"")
    single = load_config(None, [f"eval.pairs={files[0]}"])
    assert single.eval.pairs == str(files[0]) and single.eval.pairs_files() == [str(files[0])]
    several = load_config(None, [f"eval.pairs=[{', '.join(map(str, files))}]", "eval.best_by=cfp_fp"])
    validate(several)
    assert several.eval.pairs_files() == [str(path) for path in files]
    assert load_config(None, ["eval.pairs=[~/lfw.bin]"]).eval.pairs == [str(Path.home() / "lfw.bin")]


def test_sets_are_named_apart_and_best_by_names_one(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for path in (tmp_path / "a" / "lfw.bin", tmp_path / "b" / "lfw.bin", tmp_path / "cfp_fp.bin"):
        path.write_bytes(b"")
    both = f"[{tmp_path / 'a' / 'lfw.bin'}, {tmp_path / 'b' / 'lfw.bin'}]"
    assert "would both be the set 'lfw'; rename one" in config_error(f"eval.pairs={both}")
    two = f"[{tmp_path / 'a' / 'lfw.bin'}, {tmp_path / 'cfp_fp.bin'}]"
    assert config_error(f"eval.pairs={two}", "eval.best_by=agedb_30") == (
        "config: eval.best_by = 'agedb_30': must be one of the eval.pairs sets: lfw, cfp_fp"
    )
    assert "eval.best_by = 'lfw': needs eval.pairs" in config_error("eval.best_by=lfw")
    assert config_error("eval.pairs=[lfw.bin, x.zip]").endswith(
        "'x.zip' must be a file ending in .bin, .csv, .txt"
    )
    assert config_error(f"eval.pairs=[{tmp_path / 'cfp_fp.bin'}, {tmp_path / 'gone.bin'}]") == (
        f"config: eval.pairs[1] = '{tmp_path / 'gone.bin'}': does not exist; drop it from eval.pairs or give the file"
    )


def one_kind_bin(path: Path, pairs: int = 10) -> Path:
    """insightface's sample small_lfw.bin in shape: (encoded images, issame), every pair matched."""
    image = cv2.imencode(".jpg", np.full((32, 32, 3), 128, np.uint8))[1].tobytes()
    path.write_bytes(pickle.dumps(([image] * (2 * pairs), [True] * pairs), protocol=pickle.HIGHEST_PROTOCOL))
    return path


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two verification sets: an LFW-style pairs.txt of colour faces, and a CSV of its first 8 pairs."""
    tmp = tmp_path_factory.mktemp("sets")
    pairs = load_pairs(write_lfw_style_set(tmp / "colours"))
    with (tmp / "subset.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        for left, right, same in list(zip(pairs.left, pairs.right, pairs.issame))[:8]:
            writer.writerow([pairs.images[left], pairs.images[right], int(same)])
    return tmp


def test_training_verifies_each_set_and_keeps_best_by_the_chosen_one(sets: Path):
    files = [str(sets / "colours" / "pairs.txt"), str(sets / "subset.csv")]
    config = tiny_config(sets, "two_sets", eval={"pairs": files, "every": 2, "best_by": "subset"})
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 0, result.stderr
    console = result.stdout + result.stderr
    run = sets / "two_sets"
    verified = {step: json.loads((run / "eval" / f"step_{step:08d}.json").read_text()) for step in (2, 4, 6)}
    for step, results in verified.items():
        assert set(results["sets"]) == {"pairs", "subset"} and results["best_by"] == "subset"
        assert results["accuracy"] == results["sets"]["subset"]["accuracy"]
        for name, source in (("pairs", "pairs.txt"), ("subset", "subset.csv")):
            figures = results["sets"][name]
            line = f"step {step}: verification {100 * figures['accuracy']:.1f} ± "
            assert any(
                text.startswith(line) and f"on {source}; XNorm {figures['xnorm']:.2f}, best " in text
                for text in console.splitlines()
            ), (line, console)
            # the training's verification reports the norms before normalisation as `facetrain eval` does
            norms = figures["norms"]
            assert norms["min"] <= figures["xnorm"] <= norms["max"] and norms["normalized_inside"] is False
    subset = {step: results["sets"]["subset"]["accuracy"] for step, results in verified.items()}
    best_step = max(sorted(subset), key=subset.get)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_step"] == best_step and summary["best_accuracy"] == subset[best_step]
    best = (run / "checkpoints" / "best").read_text().strip()
    assert json.loads((run / "checkpoints" / best / "meta.json").read_text())["step"] == best_step
    table = console[console.index("verification:\n") :].splitlines()
    assert table[1].split() == ["set", "pairs", "last", "step", "XNorm", "best", "at", "step"]
    assert table[2].split()[:2] == ["pairs", "12"] and table[3].split()[:3] == ["subset", "*", "8"]
    assert table[3].split()[-1] == str(best_step) and "eval.best_by: subset chooses best/" in table[4]


def test_a_one_kind_set_stops_training_before_it_starts(sets: Path):
    """The verifier checks every set when the trainer builds it, before the first step."""
    small = one_kind_bin(sets / "small_lfw.bin")
    cfg = load_config(tiny_config(sets, "one_kind", eval={"pairs": [str(sets / "subset.csv"), str(small)]}))
    with pytest.raises(FacetrainError) as caught:
        TrainingVerifier(cfg, init_parallel())
    assert str(caught.value) == (
        f"{small} holds 10 pairs: 10 matched, 0 mismatched; verification accuracy, its threshold, ROC and "
        "TAR at FAR need mismatched pairs too; drop it from eval.pairs or use a pack with both kinds"
    )


def test_history_of_a_resumed_run_comes_from_its_eval_files(tmp_path: Path):
    """Files of the old single-set form count under the pairs file's stem; files from the resumed step
    on are a discarded future and do not."""
    old = {"step": 2, "accuracy": 0.7, "pairs_file": "/data/lfw.bin", "xnorm": 20.0}
    new = {"step": 4, "accuracy": 0.8, "sets": {"lfw": {"accuracy": 0.8}, "cfp_fp": {"accuracy": 0.6}}}
    later = {"step": 6, "accuracy": 0.9, "sets": {"lfw": {"accuracy": 0.9}}}
    for results in (old, new, later):
        (tmp_path / f"step_{results['step']:08d}.json").write_text(json.dumps(results))
    (tmp_path / "step_00000005.json").write_text("{broken")
    history = read_history(tmp_path, step=6)
    assert {name: sorted(steps) for name, steps in history.items()} == {"lfw": [2, 4], "cfp_fp": [4]}
    assert history["lfw"][2]["accuracy"] == 0.7


def figures(accuracy: float, best: float, best_step: int) -> dict:
    return {
        "accuracy": accuracy, "accuracy_std": 0.01, "auc": 0.99, "xnorm": 21.234, "num_pairs": 6000,
        "pairs_file": "/data/lfw.bin", "best_accuracy": best, "best_step": best_step,
        "tar_at_far": {"0.01": 0.95},
    }  # fmt: skip


def test_lines_scalars_and_table_of_several_sets():
    results = {
        "step": 2000,
        "accuracy": 0.9,
        "best_by": "cfp_fp",
        "sets": {"lfw": figures(0.995, 0.996, 1000), "cfp_fp": figures(0.9, 0.9, 2000)},
    }
    results["sets"]["cfp_fp"]["pairs_file"] = "/data/cfp_fp.bin"
    assert report_lines(results, "cfp_fp") == [
        "step 2000: verification 99.5 ± 1.0 % (AUC 0.990, TAR 95.0 % at FAR 1e-2) on lfw.bin; XNorm 21.23, "
        "best 99.6 % at step 1000",
        "step 2000: verification 90.0 ± 1.0 % (AUC 0.990, TAR 95.0 % at FAR 1e-2) on cfp_fp.bin; XNorm 21.23, "
        "best 90.0 % at step 2000 (keeps best/)",
    ]
    assert report_lines({"step": 5, "accuracy": 0.5}, "lfw") == ["step 5: verification 50.0 %"]
    scalars = tensorboard_scalars(results)
    assert scalars["lfw/accuracy"] == 0.995 and scalars["cfp_fp/xnorm"] == 21.234
    assert scalars["lfw/best_accuracy"] == 0.996 and len(scalars) == 8
    history = {
        "lfw": {1000: figures(0.996, 0, 0), 2000: figures(0.995, 0, 0)},
        "cfp_fp": {2000: figures(0.9, 0, 0)},
    }
    assert final_table(history, ["lfw", "cfp_fp", "agedb_30"], "cfp_fp").splitlines() == [
        "verification:",
        "  set       pairs  last            step  XNorm  best     at step",
        "  lfw       6000   99.50 ± 1.00 %  2000  21.23  99.60 %  1000",
        "  cfp_fp *  6000   90.00 ± 1.00 %  2000  21.23  90.00 %  2000",
        "  * eval.best_by: cfp_fp chooses best/",
    ]
    assert final_table({}, ["lfw"], "lfw") is None


def test_best_min_gain_keeps_the_earlier_step_unless_a_later_one_beats_it_by_more():
    verified = {
        0: {"accuracy": 0.95},
        200: {"accuracy": 0.955},
        400: {"accuracy": 0.962},
        600: {"accuracy": 0.97},
    }
    assert best_step(verified) == 600
    assert best_step(verified, 0.01) == 400  # 0.962 > 0.95 + 0.01; then 0.97 is not > 0.972
    assert best_step(verified, 0.05) == 0
    assert best_step({0: {"accuracy": 0.9}, 2: {"accuracy": 0.9}}) == 0  # the earliest on a tie
    history = {"lfw": {step: figures(value["accuracy"], 0, 0) for step, value in verified.items()}}
    assert final_table(history, ["lfw"], "lfw", 0.05).splitlines()[2].split()[-1] == "0"
