"""One line for a learning-rate schedule that a resume reshapes, and one for a schedule that cannot work.

The schedule is a pure function of the step, train.steps and optim's schedule keys (`optim.lr_factor`),
so resuming with another train.steps quietly reshapes it (issue 43: a polynomial schedule started for
200 steps and resumed with 36 went from lr 0.09 to 3.9e-4 at step 33). Changing it on resume is legitimate (a run
extended, a schedule shortened); doing it unknowingly is not, so the change and its effect are said.
"""

from __future__ import annotations

import math

from facetrain.train.optim import lr_factor
from facetrain.train.run_config import Config

SCHEDULE_KEYS = (
    "train.steps",
    "optim.lr",
    "optim.schedule",
    "optim.power",
    "optim.warmup_steps",
    "optim.min_lr",
)
# points of the remaining schedule compared to tell a reshaped schedule from a renamed but equal one
PROBES = 16


def lr_at(cfg: Config, step: int) -> float:
    """optim.lr on `cfg`'s schedule at `step` (the head's; the backbone's is backbone_lr_scale of it)."""
    return cfg.optim.lr * lr_factor(cfg.optim, step, cfg.train.steps)


def schedule_change_line(trained: Config, now: Config, step: int) -> str | None:
    """The note for resuming at `step` the checkpoint's schedule (`trained`) with `now`'s, or None when
    the lr over the steps left is unchanged (a constant schedule with more steps is the same schedule)."""
    changed = [key for key in SCHEDULE_KEYS if _value(trained, key) != _value(now, key)]
    changes = ", ".join(f"{key} {_value(trained, key)} -> {_value(now, key)}" for key in changed)
    if not changed or step >= now.train.steps:  # nothing left to train: `nothing_left_to_train` says so
        return None
    end = max(step + 1, min(trained.train.steps, now.train.steps))
    probes = {step, *range(step, end, max(1, (end - step) // PROBES))}
    if all(math.isclose(lr_at(trained, t), lr_at(now, t), rel_tol=1e-9) for t in probes):
        return None
    return (
        f"note: resuming reshapes the lr schedule ({changes}): "
        f"lr at step {step} {lr_at(trained, step):.3g} -> {lr_at(now, step):.3g}"
    )


def schedule_warning(cfg: Config) -> str | None:
    """A warmup as long as the run: the lr only ever rises, and the run ends at (or short of) its peak."""
    warmup, steps = cfg.optim.warmup_steps, cfg.train.steps
    if warmup < steps:
        return None
    return (
        f"warning: optim.warmup_steps={warmup} >= train.steps={steps}: the lr only rises and never decays, "
        f"ending at {lr_at(cfg, steps - 1):.3g}; lower optim.warmup_steps (a tenth of train.steps is usual)"
    )


def _value(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)
