"""`make demo` end to end at a reduced size: tools/demo.sh itself, on a tiny synthetic set, 2 ranks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from facetrain.eval.set_names import report_file_name

ROOT = Path(__file__).resolve().parents[1]
SIMILARITY = re.compile(
    r"similarity (-?\d+\.\d+)\s+threshold (-?\d+\.\d+)\s+-> (same person|different people)"
)


@pytest.mark.slow
@pytest.mark.ranks  # demo.sh trains with --nproc 2
def test_demo_script_runs_every_step_at_a_reduced_size(tmp_path: Path) -> None:
    data, run = tmp_path / "synth", tmp_path / "run"
    environment = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "OMP_NUM_THREADS": "1",
        "DEMO_DATA": str(data),
        "DEMO_RUN": str(run),
        "DEMO_SYNTH_ARGS": "--identities 8 --images-per-identity 4 --heldout-identities 6 "
        "--heldout-images-per-identity 3 --pairs-folds 2 --pairs-per-fold 8 --image-size 32",
        "DEMO_TRAIN_ARGS": "--set train.steps=4 --set train.batch_size=8 --set data.image_size=[32,32] "
        "--set eval.every=2 --set optim.warmup_steps=0",
    }
    result = subprocess.run(
        ["bash", str(ROOT / "tools" / "demo.sh")],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    assert (data / "heldout" / "pairs.txt").is_file()
    assert (run / "checkpoints" / "best").is_file()
    name = report_file_name(data / "heldout" / "pairs.txt")
    report = json.loads((run / "eval" / f"{name}.json").read_text())
    assert 0.0 <= report["accuracy"] <= 1.0
    assert (run / "eval" / f"{name}_roc.png").stat().st_size > 0
    for name in ("model.safetensors", "model.torchscript.pt", "model.onnx", "model.json"):
        assert (run / "export" / name).is_file(), name
    card = json.loads((run / "export" / "model.json").read_text())
    assert card["files"]["onnx"]["max_abs_diff"] <= 1e-4
    comparisons = SIMILARITY.findall(result.stdout)
    assert len(comparisons) == 2, result.stdout[-2000:]
    for similarity, threshold, verdict in comparisons:
        assert -1.0 <= float(similarity) <= 1.0
        assert float(threshold) == pytest.approx(card["threshold"], abs=1e-4)
        if abs(float(similarity) - float(threshold)) > 1e-4:  # printed to 4 decimals: ties are unreadable
            assert verdict == ("same person" if float(similarity) > float(threshold) else "different people")
    assert str(run / "export") in result.stdout
