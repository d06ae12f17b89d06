"""Verification on a pairs set during training: rank 0 embeds and scores, every rank learns the result.

Every rank needs the accuracy, because keeping the best checkpoint is a collective save. A verification
that fails (a pairs image became unreadable, the disk is full) must not cost the training: rank 0
reports it in one line, every rank learns that it failed, and the trainer goes on without it.

The other ranks wait for rank 0 on the CPU group (`ParallelDims.control_group`), not in an NCCL
collective, whose watchdog would abort them while rank 0 embeds the pairs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from facetrain.config import Config
from facetrain.data.decode import BadImageError
from facetrain.errors import FacetrainError
from facetrain.parallel import comm
from facetrain.parallel.dims import ParallelDims
from facetrain.progress import ProgressBar


class TrainingVerifier:
    def __init__(self, cfg: Config, dims: ParallelDims):
        self.cfg, self.dims = cfg, dims
        self.out_dir = Path(cfg.train.output_dir) / "eval"

        def load():
            from facetrain.eval.verify_pairs import load_pairs

            return load_pairs(cfg.eval.pairs, cfg.eval.images)

        # rank 0 checks the pairs and images now, so a bad path fails before training starts
        self.pairs = comm.primary_first(load, also_others=False, group=dims.control_group)
        self.failure: str | None = None  # rank 0's one-line reason once a verification failed

    def run(self, backbone: nn.Module, step: int) -> dict | None:
        """The verification's results on every rank, or None when it failed (see `failure`)."""
        # [accuracy, failed]
        group = self.dims.control_group
        outcome = torch.zeros(2, dtype=torch.float64, device=comm.collective_device(group))
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
                ProgressBar.write(f"warning: {self.failure}; training goes on without verification")
                outcome[1] = 1
            finally:
                backbone.train(was_training)
        comm.broadcast_(outcome, 0, group)
        if outcome[1]:
            self.failure = self.failure or f"verification at step {step} failed on rank 0"
            return None
        return results or {"accuracy": float(outcome[0]), "step": step}

    def _verify(self, backbone: nn.Module, step: int) -> dict:
        from facetrain.eval.verify_pairs import verify

        outcome = verify(
            self.pairs,
            backbone,
            tuple(self.cfg.data.image_size),
            batch_size=self.cfg.eval.batch_size,
            flip=self.cfg.eval.flip,
            device=self.dims.device,
            progress=False,
        )
        results = {**outcome.as_dict(), "step": step}
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"step_{step:08d}.json").write_text(json.dumps(results, indent=2))
        return results
