"""The `eval` section of a run's config: the verification sets a run reports on while it trains; each
file is checked against the pairs formats this package reads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from facetrain.config.bounds import BATCH_SIZE
from facetrain.config.checks import NotEmpty, RegisteredSuffix, Within, at_least, setting
from facetrain.config.validate import Problem
from facetrain.eval.pairs import PAIR_FORMATS
from facetrain.eval.set_names import duplicate_name, set_names


@dataclass
class EvalConfig:
    # one verification set or a list of them, each an LFW-format pairs.txt, a pairs CSV or an insightface
    # .bin, e.g. [lfw.bin, cfp_fp.bin, agedb_30.bin]; each set is named by its file's stem (lfw, cfp_fp)
    pairs: str | list[str] | None = setting(None, RegisteredSuffix(PAIR_FORMATS), path=True)
    # image root of the pairs.txt and CSV sets; default: each pairs file's folder
    images: str | None = setting(None, NotEmpty(), path=True)
    every: int = setting(0, at_least(0))  # verify every N steps during training (0: only at the end)
    # the set whose accuracy keeps best/, by name (cfp_fp for .../cfp_fp.bin); null: the first set
    best_by: str | None = setting(None, NotEmpty())
    # a later step keeps best/ only when its accuracy beats the best so far by more than this (0.01: one
    # point). On a few hundred pairs, whose accuracy has a standard error of about a point, noise alone
    # would otherwise pick a fine-tune's step over a start it does not beat (docs/accuracy.md, CelebA-dev)
    best_min_gain: float = setting(0.0, Within(0, 1, "[)"))
    batch_size: int = setting(128, BATCH_SIZE)
    flip: bool = True

    def pairs_files(self) -> list[str]:
        """`pairs` as a list, whether the config gave one file, several or none."""
        if self.pairs is None:
            return []
        return [self.pairs] if isinstance(self.pairs, str) else list(self.pairs)


def set_problems(evaluation: EvalConfig) -> Iterator[Problem]:
    """Sets log and report under their file's stem, and eval.best_by picks one by that name: two files
    of one stem, or a best_by that names no set, are refused."""
    files = evaluation.pairs_files()
    if (clash := duplicate_name(files)) is not None:
        name, paths = clash
        yield (
            "eval.pairs",
            evaluation.pairs,
            f"{' and '.join(paths)} would both be the set {name!r}; rename one (sets are named by the "
            "file's stem)",
        )
    if evaluation.best_by is not None and evaluation.best_by not in set_names(files):
        if files:
            allowed = f"must be one of the eval.pairs sets: {', '.join(set_names(files))}"
        else:
            allowed = "needs eval.pairs, the sets it chooses from"
        yield "eval.best_by", evaluation.best_by, allowed
