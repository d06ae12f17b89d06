"""`facetrain bench head --peers`: the peers run beside facetrain's heads on the CPU, computing what they
claim to (insightface's ArcFace loss equals facetrain's), and the report compares like with like.

Uses `../shared/peers` (insightface's files and the wheels); skips cleanly without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from facetrain.bench.head_cases import HeadCase
from facetrain.bench.head_report import FILES, peer_table
from facetrain.cli import main
from tests.support.distributed import run_distributed

PEERS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "peers"


@pytest.fixture
def peers_dir() -> Path:
    if not (PEERS_DIR / "insightface_arcface_torch" / "partial_fc_v2.py").is_file():
        pytest.skip(f"no peers folder at {PEERS_DIR} (../shared/peers beside the checkout)")
    return PEERS_DIR


def _insightface_and_facetrain_losses(rank, world_size, peers_dir):
    from facetrain.bench.head_peers import InsightfaceBench
    from facetrain.heads import ShardedMarginHead

    case = HeadCase("insightface", 50, world_size, 12, 8, peers_dir=str(peers_dir))
    torch.manual_seed(0)
    weight = torch.randn(50, 8)
    labels = torch.randint(0, 50, (world_size, 6))[rank]
    # near their class (a loss of a few nats): at random, s = 64 puts target probabilities below the
    # 1e-30 insightface clamps them to, and its loss saturates at 69.08 a row where facetrain's does not
    embeddings = weight[labels] + 0.3 * torch.randn(world_size, 6, 8)[rank]
    peer = InsightfaceBench().build(case)
    ours = ShardedMarginHead(50, 8, margin="arcface", scale=64.0, m=0.5)
    assert (ours.class_start, ours.class_count) == (peer.partial_fc.class_start, peer.partial_fc.num_local)
    rows = weight[ours.class_start : ours.class_start + ours.class_count]
    with torch.no_grad():
        ours.weight.copy_(rows)
        peer.partial_fc.weight.copy_(rows)
    return peer(embeddings, labels).loss.item(), ours(embeddings, labels).loss.item()


def test_insightface_at_full_rate_computes_facetrains_arcface_loss(peers_dir):
    """Same weights, same batch, two ranks: the peer's loss is facetrain's ArcFace loss (its harness is
    right; one rank, with the group the harness makes for it, runs in the bench test below)."""
    for peer_loss, our_loss in run_distributed(_insightface_and_facetrain_losses, 2, peers_dir):
        assert 0.1 < our_loss < 60
        assert peer_loss == pytest.approx(our_loss, rel=1e-5)


def test_bench_runs_the_peers_beside_facetrains_heads_on_the_cpu(peers_dir, tmp_path):
    result = CliRunner().invoke(
        main,
        ["bench", "head", "--classes", "2000", "--world-sizes", "1,2", "--batch", "16", "--dim", "32",
         "--steps", "1", "--warmup", "0", "--heads", "sharded",
         "--peers", "insightface,liger", "--peers-dir", str(peers_dir), "--out", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / FILES.names["json"]).read_text())
    rows = {(row["head"], row["world_size"]): row for row in report["results"]}
    for world_size in (1, 2):
        for head in ("sharded", "insightface", "insightface_0.3"):
            assert rows[head, world_size]["status"] == "ok"
            assert rows[head, world_size]["step_ms"] > 0
            assert rows[head, world_size]["peak_memory_max_bytes"] > 0
    assert (rows["liger", 1]["status"], rows["liger", 1]["reason"]) == (
        "unavailable",
        "its kernels are Triton: CUDA only",
    )
    assert rows["liger", 2]["reason"] == "one device only (no class sharding)"
    assert "Partial FC 0.3: a different loss" in rows["insightface_0.3", 1]["computes"]
    table = (tmp_path / FILES.names["table"]).read_text()
    assert "| 2,000 | 2 | insightface |" in table and "facetrain faster" in table


def test_a_missing_peers_folder_is_one_line(tmp_path):
    result = CliRunner().invoke(
        main,
        ["bench", "head", "--peers", "cce", "--peers-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path)],
    )
    assert result.exit_code != 0
    assert "--peers-dir" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def _row(head, margin, step_ms, peak, world_size=1):
    return {
        "head": head, "margin": margin, "status": "ok", "num_classes": 1000, "world_size": world_size,
        "step_ms": step_ms, "peak_memory_max_bytes": peak,
    }  # fmt: skip


def test_peer_table_compares_each_peer_with_facetrains_heads_of_the_same_loss():
    report = {
        "results": [
            _row("sharded", "arcface", 10.0, 900),
            _row("tiled", "arcface", 12.0, 300),
            _row("sharded_softmax", "softmax", 8.0, 800),
            _row("insightface", "arcface", 20.0, 2000),
            _row("cce", "none", 9.0, 500),
        ]
    }
    lines = peer_table(report)
    insightface = [line for line in lines if "| insightface |" in line]
    assert insightface == [
        "| 1,000 | 1 | insightface | 20.0 | 2.0 KiB | arcface | sharded | 10.0 | tiled | 300 B | yes | yes |"
    ]
    cce = [line for line in lines if "| cce |" in line]
    # against facetrain's no-margin head: faster, but it holds more (NO); against the ArcFace heads the
    # fastest is slower (NO) and the leanest (tiled) holds less
    assert cce[0].endswith("| softmax | sharded_softmax | 8.0 | sharded_softmax | 800 B | yes | NO |")
    assert cce[1].endswith("| arcface | sharded | 10.0 | tiled | 300 B | NO | yes |")
    assert peer_table({"results": [_row("sharded", "arcface", 1.0, 1)]}) == []
