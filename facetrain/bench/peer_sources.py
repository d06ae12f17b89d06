"""Where `facetrain bench head --peers` finds the implementations it compares against, and how it loads
them without making them part of facetrain.

The peers live outside the project (a folder such as `../shared/peers`, see docs/benchmarks.md): Python
files loaded by path (insightface's arcface_torch) and wheels. A wheel is installed once with
`pip install --no-deps --target` into a folder of the running environment (`<sys.prefix>/facetrain-peers`)
that only the benchmark puts on `sys.path`, so the peers never shadow anything a training run or the
test suite imports. The parent process installs them before any rank starts; ranks only add the folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import torch
import torch.distributed as dist

from facetrain.errors import FacetrainError

INSIGHTFACE_FOLDER = "insightface_arcface_torch"
WHEELS = {"liger": "liger_kernel-*.whl", "cce": "cut_cross_entropy-*.whl"}


def site_root() -> Path:
    return Path(sys.prefix) / "facetrain-peers"


def _wheel(peers_dir: Path, peer: str) -> Path:
    found = sorted((peers_dir / "wheels").glob(WHEELS[peer]))
    if not found:
        raise FacetrainError(
            f"no {WHEELS[peer]} in {peers_dir / 'wheels'}: point --peers-dir at the peers folder "
            "(its README lists the wheels)"
        )
    return found[-1]


def wheel_site(peers_dir: Path, peer: str) -> Path:
    """The folder a peer's wheel is installed into (one per wheel version)."""
    return site_root() / _wheel(peers_dir, peer).name.removesuffix(".whl")


def check_peers_dir(peers_dir: Path, peers: list[str]) -> None:
    """One line when the folder, or a file a requested peer needs, is missing."""
    if not peers_dir.is_dir():
        raise FacetrainError(
            f"--peers-dir {peers_dir} is not a folder; it holds insightface_arcface_torch/ and wheels/ "
            "(docs/benchmarks.md, 'Peers')"
        )
    for peer in peers:
        if peer in WHEELS:
            _wheel(peers_dir, peer)
        elif not (peers_dir / INSIGHTFACE_FOLDER / "partial_fc_v2.py").is_file():
            raise FacetrainError(f"no {INSIGHTFACE_FOLDER}/partial_fc_v2.py in --peers-dir {peers_dir}")


def install_wheels(peers_dir: Path, peers: list[str]) -> None:
    """pip install --no-deps each requested wheel into its own folder, once (offline: a local file)."""
    for peer in peers:
        if peer not in WHEELS or wheel_site(peers_dir, peer).is_dir():
            continue
        target = wheel_site(peers_dir, peer)
        partial = target.with_name(target.name + ".partial")
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                   "--disable-pip-version-check", "--target", str(partial), str(_wheel(peers_dir, peer))]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise FacetrainError(f"could not install {_wheel(peers_dir, peer).name}: {last}")
        partial.rename(target)


def import_wheel(peers_dir: Path, peer: str, module: str) -> ModuleType:
    """Import `module` from the peer's installed wheel (install_wheels ran in the parent)."""
    site = str(wheel_site(peers_dir, peer))
    if site not in sys.path:
        sys.path.insert(0, site)
    return importlib.import_module(module)


def load_insightface(peers_dir: Path) -> tuple[ModuleType, ModuleType]:
    """insightface's partial_fc_v2.py and losses.py, loaded by path under names of their own."""
    modules = []
    for name in ("partial_fc_v2", "losses"):
        qualified = f"facetrain_peer_insightface_{name}"
        if qualified not in sys.modules:
            spec = importlib.util.spec_from_file_location(
                qualified, peers_dir / INSIGHTFACE_FOLDER / f"{name}.py"
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules[qualified] = module
            spec.loader.exec_module(module)
        modules.append(sys.modules[qualified])
    return modules[0], modules[1]


@contextlib.contextmanager
def cuda_calls_to(device: torch.device):
    """`Tensor.cuda()` moves to `device` instead, while inside: insightface's Partial FC calls `.cuda()`
    in its forward, and the harness (not an edit of its file) is what lets it run on the CPU."""
    if device.type == "cuda":
        yield
        return
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor.to(device)
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def join_one_rank_group(device: torch.device) -> None:
    """A process group of this process alone, where none exists: insightface's Partial FC asserts one
    even on one device (facetrain's workers create none for a single rank)."""
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
