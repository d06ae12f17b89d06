"""The README's laptop path, run exactly as printed, on a generated folder of a few hundred faces.

`facetrain align` needs real photos (dlib finds no face in a generated one), so generated 112x112 faces,
the size `align` writes, stand in for its two output folders; every other command of the block runs
word for word, from a copy of the checkout's configs, with HOME in the test's folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facetrain.config import SynthConfig
from facetrain.data.synthetic import generate_synthetic

REPO = Path(__file__).resolve().parents[1]


def laptop_commands() -> list[str]:
    """The commands of the README's first code block under "On a laptop (CPU)"."""
    section = (REPO / "README.md").read_text().split("### On a laptop (CPU)\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def write_aligned_stand_ins(home: Path) -> None:
    """~/faces: 24 people x 10 faces (240 photos); ~/faces_heldout: 6 other people x 5."""
    people = SynthConfig(
        identities=24,
        images_per_identity=10,
        heldout_identities=6,
        heldout_images_per_identity=5,
        pairs_folds=2,
        pairs_per_fold=10,
        image_size=112,
    )
    generated = generate_synthetic(home / "generated", people, progress=False)
    (generated / "train").rename(home / "faces")
    (generated / "heldout" / "pairs.txt").unlink()  # the README makes its own pairs
    (generated / "heldout").rename(home / "faces_heldout")


@pytest.mark.slow
def test_the_readme_laptop_commands_run_exactly_as_printed(tmp_path):
    commands = laptop_commands()
    assert [command.split()[:2] for command in commands] == [
        ["facetrain", "align"],
        ["facetrain", "align"],
        ["facetrain", "pairs"],
        ["facetrain", "train"],
    ]
    home, checkout = tmp_path / "home", tmp_path / "checkout"
    write_aligned_stand_ins(home)
    shutil.copytree(REPO / "configs", checkout / "configs")
    script = "\n".join(
        ["set -e", f'facetrain() {{ "{sys.executable}" -m facetrain "$@"; }}']
        + [command for command in commands if not command.startswith("facetrain align ")]
    )
    environment = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    result = subprocess.run(
        ["bash", "-c", script], cwd=checkout, env=environment, capture_output=True, text=True, timeout=900
    )
    print(f"README laptop path: {time.perf_counter() - started:.0f} s, load {os.getloadavg()[0]:.1f}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (home / "heldout_pairs.csv").is_file()
    summary = json.loads((checkout / "runs" / "laptop" / "summary.json").read_text())
    assert summary["steps"] == 300
    assert summary["evaluation"]["num_pairs"] > 0 and 0.5 <= summary["evaluation"]["accuracy"] <= 1
    console = result.stdout + result.stderr
    for step in (100, 200, 300):
        assert f"step {step}: verification " in console
    assert "warning" not in console.lower()  # no DataLoader-worker or pin_memory warnings on a CPU
    assert "\r" not in console  # progress in a log is plain lines, not redrawn bars
