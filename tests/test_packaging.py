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
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support import cli_zygote
from tests.support.readme import TINY, readme_blocks

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
"""


def run_without_app(code: str, pythonpath: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_APP + code, json.dumps(APP_DEPENDENCIES)],
        capture_output=True, text=True, timeout=120, cwd=pythonpath,
        env={**os.environ, "PYTHONPATH": str(pythonpath)},
    )  # fmt: skip


def test_the_command_line_without_its_dependencies_names_the_extra_in_one_line():
    done = run_without_app("import runpy; runpy.run_module('facetrain', run_name='__main__')", REPO)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: facetrain's command line needs click, which is not installed: pip install 'facetrain[app]'"
    ]


def copy_of_the_checkout(into: Path) -> Path:
    """What a clone holds (git's files, committed or not, links kept as links: facetrain/recipes is
    one), so the wheel is built from what a user's clone would build it from."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, check=True, timeout=60,
        ).stdout.decode()  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # no git: the checkout less what runs and builds made
        return Path(shutil.copytree(REPO, into, symlinks=True, ignore=_made_here, dirs_exist_ok=True))
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_symlink() or source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name, follow_symlinks=False)
    return into


def _made_here(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == REPO
    return {
        name for name in names
        if name in (".git", ".venv", "build", "__pycache__") or name.endswith(".egg-info")
        or (top and name in ("runs", "data"))
    }  # fmt: skip


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = copy_of_the_checkout(tmp_path_factory.mktemp("source"))
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


def test_the_wheel_holds_the_package_every_recipe_and_the_slurm_scripts_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        entries = archive.infolist()
    names = [entry.filename for entry in entries]
    recipes = {
        name.removeprefix("facetrain/recipes/") for name in names if name.startswith("facetrain/recipes/")
    }
    assert recipes == {path.name for path in (REPO / "configs").glob("*.yaml")}
    scripts = {name for name in names if name.startswith("facetrain/cli/slurm/")}
    assert scripts == {"facetrain/cli/slurm/train.sbatch", "facetrain/cli/slurm/train_multinode.sbatch"}
    # no tests, examples, tools, docs or their figures, no data (../shared's faces and pairs)
    assert [name for name in names if not name.startswith(("facetrain/", "facetrain-"))] == []
    assert [name for name in names if name.lower().endswith((".png", ".jpg", ".jpeg", ".pgm", ".rec"))] == []
    assert sum(entry.file_size for entry in entries) < 4 << 20


@pytest.fixture(scope="module")
def pip_installed(wheel, tmp_path_factory) -> Path:
    """The wheel installed into a fresh virtualenv outside the checkout, as `pip install` does, the
    dependencies this interpreter has installed reachable through a .pth file (no network): the
    venv's bin/ folder."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    installed = dict.fromkeys(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib"))
    Path(site, "installed_here.pth").write_text("".join(f"{path}\n" for path in installed))
    # --ignore-installed: this interpreter's editable facetrain is visible there too, and stays as it is
    done = subprocess.run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"


def installed_env(bin_dir: Path) -> dict[str, str]:
    """The venv first on PATH, nothing of the checkout importable, one OpenMP thread a process (as
    tests/support/train_helpers.py's cli_env: the suite's processes share the cores, and a server
    with OpenMP's threads running cannot fork)."""
    env = {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": f"{bin_dir}:{env['PATH']}", "OMP_NUM_THREADS": "1"}


def run_installed(bin_dir: Path, command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` in bash, in `cwd`, with installed_env."""
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=installed_env(bin_dir),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def installed_cli(pip_installed):
    """The venv's `python -m facetrain ARGS` forked from a server that imported the installed package
    and torch once (tests/support/cli_zygote.py), as the suite's other commands are: each command still
    runs in a process of its own, from the wheel's files, and the `facetrain` script itself is run by
    the block's `config --recipes`, `--help`, `--version` and `slurm-script`. Without a server that can
    fork, each command starts the script in bash."""
    server = cli_zygote.Server(installed_env(pip_installed), python=str(pip_installed / "python"))
    yield (
        lambda words, cwd: (
            server.run(words[1:], cwd, installed_env(pip_installed), timeout=600)
            if server.forks
            else run_installed(pip_installed, shlex.join(words), cwd)
        )
    )
    server.stop()


@pytest.mark.slow
def test_the_readme_pip_quick_start_runs_from_an_empty_folder_with_the_installed_wheel(
    pip_installed, installed_cli, tmp_path
):
    """README's pip block as printed (`pip install` being the wheel's install above), each command
    with the tiny sizes of tests/test_readme.py, and what a pip user types besides: --help, --version,
    a starting config from a recipe and a Slurm script."""
    lines = [line for line in readme_blocks()["Quick start #2"].splitlines() if line.strip()]
    assert lines[0].startswith("pip install 'facetrain[app]'")
    commands = [shlex.split(line, comments=True) for line in lines[1:]]
    assert [words[:2] for words in commands] == [
        ["facetrain", verb] for verb in ("config", "synth", "train", "eval", "export")
    ]
    folder = tmp_path / "empty"
    folder.mkdir()
    for words in commands:
        words = words + TINY.get(words[1], "").split()
        # the light `config --recipes` imports no torch: the installed script itself
        light = words[1] == "config"
        done = (
            run_installed(pip_installed, shlex.join(words), folder) if light else installed_cli(words, folder)
        )
        assert done.returncode == 0, f"{shlex.join(words)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        if words[1] == "config":
            assert [line.split()[0] for line in done.stdout.splitlines()] == sorted(
                path.stem for path in (REPO / "configs").glob("*.yaml")
            )
    assert json.loads((folder / "runs" / "laptop" / "summary.json").read_text())["steps"] == 4
    assert (folder / "runs" / "laptop" / "export" / "model.onnx").is_file()
    from facetrain import __version__

    shown = run_installed(pip_installed, "facetrain --help && facetrain --version", folder)
    assert shown.returncode == 0 and "slurm-script" in shown.stdout, shown.stderr
    assert shown.stdout.splitlines()[-1] == f"facetrain {__version__}"  # no commit outside a checkout
    elsewhere = tmp_path / "elsewhere"  # no faces/ here: the recipe's data path is not there
    elsewhere.mkdir()
    made = installed_cli(["facetrain", "config", "-c", "laptop"], elsewhere)  # > my.yaml
    assert made.returncode == 0, made.stderr
    assert made.stderr.startswith("note: data.path = 'faces' is recipe laptop's placeholder"), made.stderr
    (elsewhere / "my.yaml").write_text(made.stdout)
    scripted = run_installed(pip_installed, "facetrain slurm-script --nodes 3 > x.sbatch", elsewhere)
    assert scripted.returncode == 0, scripted.stderr
    assert yaml.safe_load((elsewhere / "my.yaml").read_text())["train"]["output_dir"] == "runs/laptop"
    assert "#SBATCH --nodes=3\n" in (elsewhere / "x.sbatch").read_text()


def test_the_head_and_its_quick_start_run_from_the_installed_wheel_with_torch_alone(pip_installed, tmp_path):
    """`pip install facetrain`: with every application dependency made uninstalled, the installed
    facetrain.heads trains untiled and tiled with its fused SGD, and examples/single_process.py, the
    runnable form of docs/head.md's quick start (README's library section), runs. One interpreter for
    both: the checkout's facetrain/ and the wheel's are the same files (the wheel is built from them),
    so the installed copy answers for the checkout's too."""
    shutil.copy(REPO / "examples" / "single_process.py", tmp_path)
    code = (
        WITHOUT_APP
        + USE_THE_HEAD
        + (
            "import runpy; sys.argv = ['single_process.py', '--steps', '3']\n"
            "runpy.run_path('single_process.py', run_name='__main__')\n"
            "import facetrain; print(json.dumps({'asked': asked, 'facetrain': facetrain.__file__}))\n"
        )
    )
    done = run_installed(
        pip_installed, shlex.join(["python", "-c", code, json.dumps(APP_DEPENDENCIES)]), tmp_path
    )
    assert done.returncode == 0, done.stderr
    *steps, last = done.stdout.splitlines()
    assert len(steps) == 3 and steps[0].startswith("step 0: loss ")
    report = json.loads(last)
    assert Path(report["facetrain"]).is_relative_to(pip_installed.parent)
    assert [asked for asked in report["asked"] if asked[1].startswith("facetrain")] == []
