"""The README's bash blocks and the options that make its quick start run in seconds: read by the README
test and by the pip user's test, which runs the pip quick start from the installed wheel."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
INLINE_CODE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
OLD_SPELLINGS = "## Spellings of the last release"  # docs/cli.md's section that shows them, from here on
# what the quick start's commands add to run in seconds instead of minutes (the block's own words first)
TINY = {
    "synth": "--identities 8 --images-per-identity 4 --heldout-identities 6 --heldout-images-per-identity 3 "
    "--pairs-folds 2 --pairs-per-fold 8 --image-size 32 -q",
    "train": "--set train.steps=4 --set train.batch_size=8 --set data.image_size=[32,32] --set eval.every=0 "
    "--set optim.warmup_steps=0 -q",
    "eval": "-q",
    "export": "-q",
}


def readme_blocks() -> dict[str, str]:
    """The README's bash blocks by the section heading above them (a second one under a heading: "#2")."""
    blocks: dict[str, str] = {}
    heading = ""
    for part in re.split(r"^(#+ .*)$", (REPO / "README.md").read_text(), flags=re.M):
        if part.startswith("#"):
            heading = part.lstrip("# ").strip()
            continue
        for number, (_language, body) in enumerate(
            match.groups() for match in CODE_BLOCK.finditer(part) if match.group(1) == "bash"
        ):
            blocks[heading + (f" #{number + 1}" if number else "")] = body
    return blocks
