"""dlib and the model files of `face-recognition-models`, found without importing that package.

The package's `__init__` imports `pkg_resources`, which new setuptools no longer ships, so its
model files are located through the import system's spec of the package folder instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from facetrain.errors import FacetrainError

MODELS_PACKAGE = "face_recognition_models"
INSTALL_HINT = "pip install 'facetrain[align]' (dlib-bin and face-recognition-models)"


def import_dlib() -> ModuleType:
    try:
        import dlib
    except ImportError:
        raise FacetrainError(f"face alignment needs dlib, which is not installed; {INSTALL_HINT}") from None
    return dlib


def model_file(name: str) -> Path:
    """The path of one of dlib's model files shipped in `face-recognition-models`."""
    spec = importlib.util.find_spec(MODELS_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "models" / name
        if path.is_file():
            return path
    if not folders:
        raise FacetrainError(
            f"face alignment needs dlib's face models, which are not installed; {INSTALL_HINT}"
        )
    raise FacetrainError(
        f"{name} is missing from {folders[0]}/models; reinstall face-recognition-models ({INSTALL_HINT})"
    )
