"""Verification on a pairs set during training: rank 0 embeds and scores, every rank learns the result.

Every rank needs the accuracy, because keeping the best checkpoint is a collective save.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from facetrain.config import Config
from facetrain.parallel import comm
from facetrain.parallel.dims import ParallelDims


class TrainingVerifier:
    def __init__(self, cfg: Config, dims: ParallelDims):
        self.cfg, self.dims = cfg, dims
        self.out_dir = Path(cfg.train.output_dir) / "eval"

        def load():
            from facetrain.eval.verification import load_pairs

            return load_pairs(cfg.eval.pairs, cfg.eval.images)

        # rank 0 checks the pairs and images now, so a bad path fails before training starts
        self.pairs = comm.primary_first(load, also_others=False)

    def run(self, backbone: nn.Module, step: int) -> dict:
        accuracy = torch.zeros(1, dtype=torch.float64, device=comm.collective_device())
        results: dict = {}
        if self.dims.is_primary:
            from facetrain.eval.verification import verify

            backbone.eval()
            outcome = verify(
                self.pairs,
                backbone,
                tuple(self.cfg.data.image_size),
                batch_size=self.cfg.eval.batch_size,
                flip=self.cfg.eval.flip,
                device=self.dims.device,
                progress=False,
            )
            backbone.train()
            results = {**outcome.as_dict(), "step": step}
            self.out_dir.mkdir(parents=True, exist_ok=True)
            (self.out_dir / f"step_{step:08d}.json").write_text(json.dumps(results, indent=2))
            accuracy[0] = results["accuracy"]
        comm.broadcast_(accuracy, 0)
        return results or {"accuracy": float(accuracy[0]), "step": step}
