"""`python -m facetrain` and the `facetrain` command.

`pip install facetrain` is the library (facetrain.heads), which needs torch alone; the command line
needs the application's dependencies, the `app` extra. Without them it says so in one line instead of
a traceback.
"""

import sys

from facetrain.logger import logger

# The top-level modules of the `app` extra's packages (pyproject.toml)
APP_MODULES = frozenset(
    {"click", "yaml", "cv2", "pandas", "matplotlib", "tqdm", "torchvision", "safetensors"}
)


def main() -> None:
    try:
        from facetrain.cli import main as command_line

        command_line()
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in APP_MODULES:
            raise
        logger.error(
            f"error: facetrain's command line needs {error.name}, which is not installed: "
            "pip install 'facetrain[app]'"
        )
        sys.exit(2)


if __name__ == "__main__":
    main()
