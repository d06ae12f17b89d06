"""What the trainer tells the person watching it: each verification as one line, a warning when a
run looks under-fitted while there is still time to stop it, and a note when a resume has nothing left
to train.

A recipe fitted to a few dozen identities can leave a run on thousands of identities near chance for
its whole schedule (docs/accuracy.md measured 8 % training accuracy after 1,800 steps on 1,505 LFW
people); the loss alone does not say so to a newcomer, the training accuracy against chance does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Checked once, when this share of the schedule is done: late enough for any sane warmup to be over,
# early enough that stopping saves most of the run.
UNDERFIT_CHECK_SHARE = 0.3
# "Near chance": training accuracy within this many points of 1 / classes.
UNDERFIT_MARGIN = 0.05


def nothing_left_to_train(step: int, steps: int) -> str | None:
    """A resume at or past train.steps trains nothing; without this note, `done: 10 steps` after
    `--set train.steps=4` reads as if the new setting had been ignored."""
    if step < steps:
        return None
    where = "already at" if step == steps else "past"
    return (
        f"note: the checkpoint's step {step} is {where} train.steps={steps}, so there is nothing left to "
        f"train; raise train.steps above {step} to train on"
    )


def evaluation_line(step: int, outcome: dict) -> str:
    """`step 600: verification 91.3 ± 1.2 % (AUC 0.962, TAR 80.1 % at FAR 1e-2) on pairs.csv`."""
    text = f"step {step}: verification {100 * outcome['accuracy']:.1f}"
    if outcome.get("accuracy_std") is not None:
        text += f" ± {100 * outcome['accuracy_std']:.1f}"
    text += " %"
    details = []
    if outcome.get("auc") is not None:
        details.append(f"AUC {outcome['auc']:.3f}")
    tar = (outcome.get("tar_at_far") or {}).get("0.01")
    if tar is not None:
        details.append(f"TAR {100 * tar:.1f} % at FAR 1e-2")
    if details:
        text += f" ({', '.join(details)})"
    if outcome.get("pairs_file"):
        text += f" on {Path(outcome['pairs_file']).name}"
    return text


@dataclass
class UnderfitWatch:
    """Looks at the logged training accuracy once, at UNDERFIT_CHECK_SHARE of the schedule."""

    total_steps: int
    num_classes: int
    checked: bool = False

    def check(self, step: int, accuracy: float) -> str | None:
        """The warning to print, once, if the run is near chance at the check point; else None."""
        if self.checked or step < UNDERFIT_CHECK_SHARE * self.total_steps:
            return None
        self.checked = True
        chance = 1.0 / max(self.num_classes, 1)
        if accuracy >= chance + UNDERFIT_MARGIN:
            return None
        return (
            f"warning: the model looks under-fitted: training accuracy {100 * accuracy:.2f} % after "
            f"{step} of {self.total_steps} steps, near chance ({100 * chance:.2f} % for "
            f"{self.num_classes} classes); more steps, a higher optim.lr or a recipe for this data size "
            "(docs/accuracy.md) would help"
        )
