"""`pip install facetrain` is the library alone: facetrain.heads needs torch and nothing of the app.

The import checks run in fresh interpreters with a meta-path finder that makes every application
dependency look uninstalled (as in a venv with torch alone) and records who asked for one: torch
itself tries some of them and goes on without (tqdm, for its hub), facetrain's head must ask for none.
The wheel is built from a copy of the checkout (no network, no build isolation: the venv's
setuptools), so the checkout gets no build/ or egg-info.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
APP_DEPENDENCIES = [
    "cv2", "pandas", "sklearn", "matplotlib", "onnx", "onnxruntime", "dlib", "click", "tqdm", "yaml",
    "torchvision", "safetensors",
]  # fmt: skip

# Installs the finder, then runs the code after it; prints who asked for a blocked module.
WITHOUT_APP = """
import json, sys
blocked, asked = set(json.loads(sys.argv[1])), []

class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in blocked:
            return None
        frame = sys._getframe(1)
        while frame.f_code.co_filename.startswith("<frozen"):
            if frame.f_code.co_filename == "<frozen importlib.util>":
                return None  # a probe (importlib.util.find_spec: torch listing what exists), not an import
            frame = frame.f_back
        asked.append([name, frame.f_globals.get("__name__", "?")])
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Uninstalled())
"""

USE_THE_HEAD = """
import torch
import facetrain
from facetrain.heads import HeadPlan, ShardedMarginHead
from facetrain.heads.fused_optim import FusedSGD

for tiles in (None, 3):
    plan = HeadPlan("tiled", tiles, fused_optimizer=True) if tiles else HeadPlan()
    head = ShardedMarginHead(10, 4, plan=plan)
    if tiles:
        head.fuse_optimizer(FusedSGD([head.weight], lr=0.1))
    embeddings = torch.randn(6, 4, requires_grad=True)
    head(embeddings, torch.arange(6)).loss.backward()
    assert embeddings.grad.abs().sum() > 0
print(json.dumps({"asked": asked, "facetrain": facetrain.__file__}))
"""


def run_without_app(code: str, pythonpath: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_APP + code, json.dumps(APP_DEPENDENCIES)],
        capture_output=True, text=True, timeout=120, cwd=pythonpath,
        env={**os.environ, "PYTHONPATH": str(pythonpath)},
    )  # fmt: skip


def assert_the_head_runs_without_app(pythonpath: Path) -> None:
    done = run_without_app(USE_THE_HEAD, pythonpath)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert Path(report["facetrain"]).is_relative_to(pythonpath)
    assert [asked for asked in report["asked"] if asked[1].startswith("facetrain")] == []


def test_facetrain_heads_imports_and_trains_without_the_applications_dependencies():
    assert_the_head_runs_without_app(REPO)


def test_the_command_line_without_its_dependencies_names_the_extra_in_one_line():
    done = run_without_app("import runpy; runpy.run_module('facetrain', run_name='__main__')", REPO)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: facetrain's command line needs click, which is not installed: pip install 'facetrain[app]'"
    ]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "facetrain", source / "facetrain", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("facetrain-*.whl")
    return built


def test_the_wheel_requires_torch_alone_and_offers_the_app_as_an_extra(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = email.message_from_string(
            archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
        )
        entry_points = archive.read(next(n for n in names if n.endswith("/entry_points.txt"))).decode()
    requires = metadata.get_all("Requires-Dist")
    assert [r for r in requires if "extra ==" not in r] == ["torch>=2.4"]
    app = {r.split(";")[0].strip() for r in requires if 'extra == "app"' in r}
    assert {"click>=8.1", "pyyaml>=6.0", "opencv-python>=4.8", "pandas>=2.0"} <= app
    assert "app" in metadata.get_all("Provides-Extra")
    assert "facetrain = facetrain.__main__:main" in entry_points
    assert not any(name.startswith(("tests/", "examples/")) for name in names)


def test_the_head_runs_from_the_wheel_without_the_applications_dependencies(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
    assert_the_head_runs_without_app(tmp_path)
