"""Verification on one or several pair sets during training: rank 0 embeds and scores, every rank
learns the result.

Like insightface (lfw.bin, cfp_fp.bin and agedb_30.bin at once), `eval.pairs` may list several sets,
each named by its file's stem: a console line each with its XNorm and best accuracy so far, scalars
under eval/NAME/ in TensorBoard (when installed), and a table of them all when the run ends.
`eval.best_by` names the set whose accuracy keeps `best/` (default: the first) and whose figures are
the top level of its `eval/step_N.json`, so a single set reads as it always did.

Every rank needs that accuracy, because keeping the best checkpoint is a collective save. A failed
verification (a pairs image became unreadable, the disk is full) must not cost the training: rank 0
reports it in one line, every rank learns that it failed, and the trainer goes on without it. The
other ranks wait for rank 0 on the CPU group (`ParallelDims.control_group`), not in an NCCL
collective, whose watchdog would abort them while rank 0 embeds the pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from facetrain.data.decode import BadImageError
from facetrain.errors import FacetrainError
from facetrain.eval.one_kind import require_both_kinds
from facetrain.eval.set_names import report_name, set_names
from facetrain.eval.verify_pairs import EmbedSettings, load_pairs, verify
from facetrain.files import atomic_write_text
from facetrain.heads import collectives
from facetrain.logger import logger
from facetrain.parallel.dims import ParallelDims
from facetrain.train.run_config import Config

# what TensorBoard gets of each set, under eval/NAME/
SET_SCALARS = ("accuracy", "xnorm", "auc", "best_accuracy")


class TrainingVerifier:
    def __init__(self, cfg: Config, dims: ParallelDims):
        self.cfg, self.dims = cfg, dims
        self.out_dir = Path(cfg.train.output_dir) / "eval"
        files = cfg.eval.pairs_files()
        self.names = set_names(files)
        self.best_by = cfg.eval.best_by or self.names[0]

        def load():
            pair_sets = [load_pairs(path, cfg.eval.images) for path in files]
            for pairs in pair_sets:
                require_both_kinds(pairs, "drop it from eval.pairs or use a pack with both kinds")
            return pair_sets

        # rank 0 checks the pairs and images now, so a bad path fails before training starts
        self.pair_sets = collectives.primary_first(load, also_others=False, group=dims.control_group)
        self.failure: str | None = None  # rank 0's one-line reason once a verification failed
        self.history: dict[str, dict[int, dict]] | None = None  # rank 0: per set, step -> its figures

    def run(self, backbone: nn.Module, step: int) -> dict | None:
        """The verification's results on every rank, or None when it failed (see `failure`).

        Rank 0 gets every set's figures under "sets"; the others learn the accuracy of `eval.best_by`'s.
        """
        group = self.dims.control_group
        # [accuracy, failed]
        outcome = torch.zeros(2, dtype=torch.float64, device=collectives.collective_device(group))
        results: dict = {}
        if self.dims.is_primary:
            was_training = backbone.training  # a weight average stays in eval mode
            backbone.eval()
            try:
                results = self._verify(backbone, step)
                outcome[0] = results["accuracy"]
            except (FacetrainError, OSError) as error:
                reason = f"{error.strerror} ({error.filename})" if isinstance(error, OSError) else error
                if isinstance(error, BadImageError):
                    reason = f"{error}; fix the image or drop its pairs from eval.pairs"
                self.failure = f"verification at step {step} failed: {reason}"
                logger.warning(f"warning: {self.failure}; training goes on without verification")
                outcome[1] = 1
            finally:
                backbone.train(was_training)
        collectives.broadcast_(outcome, 0, group)
        if outcome[1]:
            self.failure = self.failure or f"verification at step {step} failed on rank 0"
            return None
        return results or {"accuracy": float(outcome[0]), "step": step}

    def _verify(self, backbone: nn.Module, step: int) -> dict:
        sets = {}
        for name, pairs in zip(self.names, self.pair_sets):
            settings = EmbedSettings(
                tuple(self.cfg.data.image_size),
                batch_size=self.cfg.eval.batch_size,
                flip=self.cfg.eval.flip,
                device=self.dims.device,
                progress=False,
            )
            outcome = verify(pairs, backbone, settings)
            sets[name] = outcome.as_dict()
        if self.history is None:
            self.history = read_history(self.out_dir, step)
        for name, figures in sets.items():
            verified = self.history.setdefault(name, {})
            verified[step] = figures
            figures["best_step"] = best_step(verified, self.cfg.eval.best_min_gain)
            figures["best_accuracy"] = verified[figures["best_step"]]["accuracy"]
        results = {**sets[self.best_by], "step": step, "best_by": self.best_by, "sets": sets}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out_dir / f"step_{step:08d}.json", json.dumps(results, indent=2))
        return results

    def final_table(self) -> str | None:
        """Every set's last and best verification, printed when `facetrain train` ends; None before any
        verification (and on the ranks that keep no history)."""
        return final_table(self.history or {}, self.names, self.best_by, self.cfg.eval.best_min_gain)


def read_history(out_dir: Path, step: int) -> dict[str, dict[int, dict]]:
    """Every set's earlier verifications of this run from eval/step_N.json, per set and step: a resumed
    run compares with what it verified before it stopped. Files from `step` on belong to a schedule
    that a resume from an earlier checkpoint replaced, and are left out."""
    history: dict[str, dict[int, dict]] = {}
    for path in sorted(out_dir.glob("step_*.json")):
        try:
            earlier = json.loads(path.read_text())
            earlier_step = int(earlier["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not this reader's to judge; `facetrain plot` names a broken file
        if earlier_step >= step:
            continue
        sets = earlier.get("sets") or {report_name(earlier.get("pairs_file", "")): earlier}
        for name, figures in sets.items():
            if isinstance(figures, dict) and isinstance(figures.get("accuracy"), int | float):
                history.setdefault(name, {})[earlier_step] = figures
    return history


def replaces_best(accuracy: float, best_accuracy: float, min_gain: float) -> bool:
    """Whether a step of `accuracy` takes best/ from one of `best_accuracy`: it must beat it by more
    than `min_gain` (eval.best_min_gain). The trainer's best/ and the reports' best step share it."""
    return accuracy > best_accuracy + min_gain


def best_step(verified: dict[int, dict], min_gain: float = 0.0) -> int:
    """The step best/ keeps: in step order, each step that `replaces_best` the kept one takes its place;
    with 0, the highest accuracy, the earliest on a tie."""
    kept, *later = sorted(verified)
    for step in later:
        if replaces_best(verified[step]["accuracy"], verified[kept]["accuracy"], min_gain):
            kept = step
    return kept


def report_lines(results: dict, best_by: str) -> list[str]:
    """One console line per set: `step 2000: verification 99.5 ± 0.3 % (AUC ..., TAR ...) on lfw.bin;
    XNorm 22.41, best 99.6 % at step 1000`. A peer rank's results, without sets, give one line."""
    sets = results.get("sets")
    if not sets:
        return [evaluation_line(results["step"], results)]
    lines = []
    for name, figures in sets.items():
        line = f"{evaluation_line(results['step'], figures)}; XNorm {figures['xnorm']:.2f}"
        line += f", best {100 * figures['best_accuracy']:.1f} % at step {figures['best_step']}"
        if len(sets) > 1 and name == best_by:
            line += " (keeps best/)"
        lines.append(line)
    return lines


def tensorboard_scalars(results: dict) -> dict[str, float]:
    return {
        f"{name}/{key}": float(figures[key])
        for name, figures in (results.get("sets") or {}).items()
        for key in SET_SCALARS
        if isinstance(figures.get(key), int | float)
    }


def final_table(
    history: dict[str, dict[int, dict]], names: list[str], best_by: str, min_gain: float = 0.0
) -> str | None:
    """A row per set: its pairs, last accuracy (± its spread over folds), XNorm, best accuracy and step."""
    rows = [("set", "pairs", "last", "step", "XNorm", "best", "at step")]
    for name in names:
        verified = history.get(name)
        if not verified:
            continue
        last_step, top_step = max(verified), best_step(verified, min_gain)
        last, best = verified[last_step], verified[top_step]
        spread = f" ± {100 * last['accuracy_std']:.2f}" if last.get("accuracy_std") is not None else ""
        xnorm = last.get("xnorm")
        rows.append(
            (
                name + (" *" if name == best_by and len(names) > 1 else ""),
                str(last.get("num_pairs", "")),
                f"{100 * last['accuracy']:.2f}{spread} %",
                str(last_step),
                f"{xnorm:.2f}" if isinstance(xnorm, int | float) else "",
                f"{100 * best['accuracy']:.2f} %",
                str(top_step),
            )
        )
    if len(rows) == 1:
        return None
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["verification:"] + [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    ]
    if len(names) > 1:
        lines.append(f"  * eval.best_by: {best_by} chooses best/")
    return "\n".join(lines)


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
