"""`facetrain bench head`: its options and help, importable without torch (`--help` answers at once);
the work is facetrain.bench.head.run."""

from __future__ import annotations

from pathlib import Path

import click

from facetrain.cli.bench_options import device_option
from facetrain.cli.conventions import quiet_option


@click.command("head")
@click.option(
    "--classes",
    help="Class counts C, comma-separated [100000,1000000; --capacity: 100000,300000,1000000,3000000].",
)
@click.option(
    "--world-sizes", default="1,2,4", show_default=True, help="Ranks N (CPU processes), comma-separated."
)
@click.option("--batch", default=256, show_default=True, type=click.IntRange(min=1), help="Global batch B.")
@click.option("--dim", default=512, show_default=True, type=click.IntRange(min=1), help="Embedding size D.")
@click.option(
    "--heads",
    help="Heads to compare [sharded,tiled,dense,naive; --capacity: sharded,tiled,tiled_bf16,dense,naive]. "
    "sharded is the untiled head; tiled and tiled_bf16 the tiled head with its fused SGD; tiled_triton and "
    "tiled_triton_bf16 the same with head.kernel triton (CUDA); a _softmax suffix (sharded_softmax, "
    "tiled_softmax, tiled_bf16_softmax, tiled_triton_softmax) drops the margin. Other implementations: --peers.",
)
@click.option(
    "--margins",
    default="arcface",
    show_default=True,
    help="Without --capacity: the margins of the heads that take one (all but the _softmax kinds and the "
    "peers), comma-separated, each at its defaults (docs/head.md), e.g. arcface,cosface,adaface,magface,"
    "curricularface,elasticface_arc.",
)
@click.option(
    "--tile-classes",
    type=click.IntRange(min=1),
    help="Tile T [the trainer's default for the device: 8192 on a CPU, 65536 on CUDA].",
)
@click.option("--steps", type=click.IntRange(min=1), help="Timed steps [3; --capacity: 1].")
@click.option("--warmup", type=click.IntRange(min=0), help="Untimed steps first [1; --capacity: 0].")
@click.option(
    "--memory-limit-gb",
    default=18.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Skip configurations whose estimated memory over all ranks exceeds this; --largest fills it.",
)
@click.option(
    "--capacity",
    is_flag=True,
    help="Per-rank peak memory of a full training step (with the optimizer) against C, by head, at one "
    "world size (the first of --world-sizes); classes per GB and its targets.",
)
@click.option(
    "--largest",
    default="",
    help="With --capacity: heads whose largest trainable C under --memory-limit-gb to find, e.g. tiled_bf16,tiled.",
)
@device_option(
    "Where the heads run; cuda: rank r on GPU r modulo the GPUs (--capacity: one GPU, --world-sizes 1)."
)
@click.option(
    "--precision",
    type=click.Choice(["fp32", "bf16"]),
    default="fp32",
    show_default=True,
    help="Without --capacity: bf16 runs each step under bf16 autocast and times bf16 GEMMs.",
)
@click.option(
    "--peers",
    default="",
    help="Also measure the implementations users would pick instead, from --peers-dir: insightface "
    "(its Partial FC at sample rate 1.0 and 0.3), liger, cce (plain linear + CE, one device), "
    "comma-separated.",
)
@click.option(
    "--peers-dir",
    default="../shared/peers",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The peers' folder: insightface_arcface_torch/ and wheels/ (docs/benchmarks.md, 'Peers').",
)
@click.option(
    "-o",
    "--out",
    default="runs/bench/head",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the JSON, PNG and markdown outputs.",
)
@click.option("--overwrite", is_flag=True, help="Replace the outputs of an earlier run in --out.")
@quiet_option
def head_command(**options) -> None:
    """Compare the sharded margin head with the dense (DDP) and naive model-parallel FC, on CPU or CUDA.

    For each class count C, world size N and head, N processes each take B/N random fp32
    embeddings and time forward + backward (the tiled head's fused update included), measure per-rank
    peak memory and bytes sent per step, and the step's three untiled GEMMs alone. Prints a table and
    PASS/MISS for the targets; writes JSON, a PNG plot and the markdown table to --out.

    With --capacity: one full training step per configuration (forward, backward, SGD with momentum),
    per-rank peak memory against C for each head, classes per GB of it, and (--largest) the largest C
    one process trains under --memory-limit-gb. Writes bench_head_capacity.{json,png,md}.

    With --peers: the peers run in the same workers, timed and measured the same way; their wheels are
    installed once (pip --no-deps) into <venv>/facetrain-peers, which only this benchmark imports from.
    The table says what each head computes (a peer without a margin computes a different loss).

    \b
    Examples:
      facetrain bench head                                   # the issue's sizes (long)
      facetrain bench head --classes 100000 --world-sizes 1,2
      facetrain bench head --classes 1000,5000 --batch 16 --dim 32 --steps 1 --out /tmp/head
      facetrain bench head --heads sharded --memory-limit-gb 8 --overwrite
      facetrain bench head --capacity --world-sizes 1        # memory against C (long)
      facetrain bench head --capacity --world-sizes 1 --largest tiled_bf16,tiled --memory-limit-gb 20
      facetrain bench head --capacity --world-sizes 1 --device cuda --largest tiled_bf16 --memory-limit-gb 130
      facetrain bench head --device cuda --world-sizes 1 --batch 1024 --classes 1000000 --precision bf16
      facetrain bench head --world-sizes 1 --classes 100000 --heads tiled --margins arcface,adaface,magface
      facetrain bench head --world-sizes 1,2 --classes 20000 --heads sharded,tiled,sharded_softmax \\
          --peers insightface,cce --peers-dir ../shared/peers
    """
    from facetrain.bench.head import run

    run(**options)
