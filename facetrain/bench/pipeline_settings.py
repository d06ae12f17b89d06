"""`facetrain bench pipeline`'s settings and their defaults, importable without torch (the CLI's options
and `--help` are built from them)."""

from __future__ import annotations

from dataclasses import dataclass

from facetrain.errors import FacetrainError


@dataclass(frozen=True)
class PipelineBenchSettings:
    backbone: str = "r50"
    image_size: int = 56
    batch_size: int = 64
    embedding_size: int = 512
    stages: int = 2
    microbatches: int = 4
    split_sizes: tuple[int, ...] = (32, 16, 8)
    schedule: str = "gpipe"
    split_at: tuple[str, ...] = ()
    classes: int = 1000  # of the sharded margin head on the last stage
    repeats: int = 3
    steps: int = 2
    warmup: int = 1
    seed: int = 0
    device: str = "cpu"

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch_size, 3, self.image_size, self.image_size)

    def microbatch_counts(self) -> list[int]:
        """Model parallel (1), the pipelined bar, and every swept split size, as micro-batch counts."""
        counts = {1, self.microbatches} | {self.batch_size // size for size in self.split_sizes}
        return sorted(counts)

    def validate(self, gpu_count: int | None = None) -> None:
        import torch

        from facetrain.bench.pipeline_cases import check_stage_devices
        from facetrain.models import BACKBONES

        BACKBONES.get(self.backbone)
        check_stage_devices(
            self.device, self.stages, torch.cuda.device_count() if gpu_count is None else gpu_count
        )
        for size in (*self.split_sizes, self.batch_size // max(self.microbatches, 1)):
            if size < 1 or self.batch_size % size:
                raise FacetrainError(
                    f"micro-batch size {size} does not divide --batch-size {self.batch_size}; "
                    "choose --split-sizes and --microbatches that divide it"
                )
        if self.microbatches < 2 or self.batch_size % self.microbatches:
            raise FacetrainError(f"--microbatches {self.microbatches} must be >= 2 and divide --batch-size")
        if self.schedule == "1f1b" and min(c for c in self.microbatch_counts() if c > 1) < self.stages:
            raise FacetrainError(
                f"--schedule 1f1b needs at least --stages {self.stages} micro-batches per step"
            )


DEFAULTS = PipelineBenchSettings()
