"""`facetrain bench pipeline`'s settings and their defaults, importable without torch (the CLI's options
and `--help` are built from them); `pipeline_cases.check_settings` checks them."""

from __future__ import annotations

from dataclasses import dataclass


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


DEFAULTS = PipelineBenchSettings()
