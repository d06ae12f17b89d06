"""The sharded head's rarer settings, one object (`HeadOptions`), as `HeadPlan` groups how it computes."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

GRADIENT_REDUCTIONS = ("mean", "sum")
"""How the caller combines the backbone's gradients over the head's ranks (`ShardedMarginHead` says why)."""


@dataclass(frozen=True)
class HeadOptions:
    """`sub_centers` K weight rows a class (sub-center ArcFace, untiled only); `check_every_step` to
    re-check every rank's inputs each step (a host synchronisation), which lets row counts grow;
    `gradient_reduction` "mean" for a wrapper that averages the backbone's gradients over the ranks
    (DDP, FSDP2), "sum" for one that adds them; `label_smoothing` eps as torch's cross_entropy has it.

    A library user writes `ShardedMarginHead(C, D, options=HeadOptions(sub_centers=3))`, or passes the
    same names as keywords of the head, as before these were grouped (`split_options`)."""

    sub_centers: int = 1
    check_every_step: bool = False
    gradient_reduction: str = "mean"
    label_smoothing: float = 0.0

    def __post_init__(self):
        if self.sub_centers < 1:
            raise ValueError(f"sub_centers must be >= 1, got {self.sub_centers}")
        if self.gradient_reduction not in GRADIENT_REDUCTIONS:
            raise ValueError(
                f"gradient_reduction must be one of {', '.join(GRADIENT_REDUCTIONS)}, "
                f"got {self.gradient_reduction!r}"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


DEFAULT_OPTIONS = HeadOptions()
OPTION_NAMES = frozenset(field.name for field in fields(HeadOptions))


def split_options(options: HeadOptions, keywords: dict) -> tuple[HeadOptions, dict]:
    """`options` with the head's keywords that name one of its fields (`sub_centers=3`) applied over it,
    and the other keywords (the margin's parameters, `m=0.5`)."""
    if not isinstance(options, HeadOptions):
        raise TypeError(
            f"a head's options are a HeadOptions, not {type(options).__name__}: "
            "options=HeadOptions(sub_centers=...), or sub_centers=... as a keyword"
        )
    named = {name: value for name, value in keywords.items() if name in OPTION_NAMES}
    rest = {name: value for name, value in keywords.items() if name not in OPTION_NAMES}
    return (replace(options, **named) if named else options), rest
