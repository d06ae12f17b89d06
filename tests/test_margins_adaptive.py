"""AdaFace, MagFace, CurricularFace and ElasticFace in the sharded head equal plain dense references
written here from the papers (and the authors' code where it decides: clamps, when running
statistics update, where gradients flow; docs/head.md says where the two differ).

fp64 to 1e-10: every step's loss, the embeddings' and the weight's gradients, and the running state
after each of a few steps, in the untiled and the tiled head (T = 3, tiles that split every shard
unevenly) at world sizes 1, 2, 3 with uneven shards (23 classes: 12/11 and 8/8/7) and uneven rows.
Also: a state-dict round trip mid-run gives bit-identical later steps, the running state survives a
2 -> 3 rank checkpoint reshard, ElasticFace's draws follow N(m, sigma) and do not depend on the
number of ranks, and the warming ramp blends the new margins as it does the classic ones.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from facetrain.heads import DenseMarginHead, HeadPlan, ShardedMarginHead
from facetrain.heads.margins import base as margins_base
from facetrain.heads.margins import build_margin, margin_at_step
from facetrain.heads.margins.elasticface import standard_normals
from facetrain.heads.naive_model_parallel import NaiveModelParallelHead
from tests.support.distributed import run_distributed
from tests.support.head_problems import ROW_MARGINS, local_rows
from tests.support.margin_references import (
    BATCH,
    CLASSES,
    DIM,
    SCALE,
    assert_close,
    batches,
    reference_logits,
)

MODES = {"untiled": HeadPlan(), "tiled": HeadPlan("tiled", 3)}


# ---- the references, from the papers ------------------------------------------------------------


def reference_run(name, weight, steps):
    """Each step's loss, dX, dW, and the state after it."""
    state = {key: torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
             for key, value in build_margin(name).initial_state().items()}  # fmt: skip
    results = []
    for embeddings, labels in steps:
        x, w = embeddings.clone().requires_grad_(), weight.clone().requires_grad_()
        norm = torch.linalg.vector_norm(x, dim=1)
        cos = (x / norm[:, None]) @ (w / torch.linalg.vector_norm(w, dim=1, keepdim=True)).t()
        logits, extra, state = reference_logits(name, cos, norm, labels, state)
        loss = F.cross_entropy(SCALE * logits, labels) + extra
        loss.backward()
        results.append((loss.detach(), x.grad, w.grad, {k: v.detach().clone() for k, v in state.items()}))
    return results


# ---- the sharded head ---------------------------------------------------------------------------


def sharded_head(name, mode, weight, group=None):
    head = ShardedMarginHead(
        CLASSES, DIM, margin=name, scale=SCALE, plan=MODES[mode], group=group, gradient_reduction="sum"
    ).double()
    with torch.no_grad():
        head.weight.copy_(weight[head.class_start : head.class_stop])
    return head


def head_step(head, rank, world_size, embeddings, labels):
    rows = local_rows(world_size, rank, BATCH)
    x = embeddings[rows].clone().requires_grad_()
    head.weight.grad = None
    loss, accuracy = head(x, labels[rows])
    loss.backward()
    state = {k: v.clone() for k, v in head.margin_state.named_buffers()}
    return loss.detach(), x.grad, head.weight.grad.clone(), state, float(accuracy)


def exactness_worker(rank, world_size):
    weight, steps = batches()
    results = {}
    for name in ROW_MARGINS:
        for mode in MODES:
            head = sharded_head(name, mode, weight)
            results[name, mode] = [head_step(head, rank, world_size, *batch) for batch in steps]
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_adaptive_margins_equal_the_papers(world_size):
    per_rank = (
        [exactness_worker(0, 1)]
        if world_size == 1
        else run_distributed(exactness_worker, world_size, timeout=240)
    )
    weight, steps = batches()
    assert len(per_rank[0]) == len(ROW_MARGINS) * len(MODES)
    for name, mode in per_rank[0]:
        expected = reference_run(name, weight, steps)
        for step, (loss, grad_x, grad_w, state) in enumerate(expected):
            got = [rank_results[name, mode][step] for rank_results in per_rank]
            embeddings, labels = steps[step]
            accuracy = float(
                ((embeddings @ weight.t() / weight.norm(dim=1)).argmax(1) == labels).double().mean()
            )
            for rank_loss, _, _, rank_state, rank_accuracy in got:
                assert_close(rank_loss, loss)
                assert rank_accuracy == pytest.approx(accuracy)  # top-1 of the plain cosines
                assert rank_state.keys() == state.keys()
                for key in state:  # every rank holds the same running state, the reference's
                    assert_close(rank_state[key], state[key])
            assert_close(torch.cat([r[1] for r in got]), grad_x)
            assert_close(torch.cat([r[2] for r in got]), grad_w)


def test_the_untiled_head_modulates_and_differentiates_its_rows_block_by_block(monkeypatch):
    """The untiled head modulates the negatives in place a block of rows at a time and recomputes their
    plain logits in the backward the same way; blocks of 3 rows make each step cross four, the last
    one short. Also halfway through a margin warmup (a blended modulation), against the tiled head."""
    monkeypatch.setattr(margins_base, "MODULATED_ROWS", 3)
    weight, steps = batches()
    expected = reference_run("curricularface", weight, steps)
    untiled = sharded_head("curricularface", "untiled", weight)
    for step, batch in enumerate(steps):
        loss, grad_x, grad_w, _, _ = head_step(untiled, 0, 1, *batch)
        for got, want in zip((loss, grad_x, grad_w), expected[step]):
            assert_close(got, want)
    warming = {mode: sharded_head("curricularface", mode, weight) for mode in ("untiled", "tiled")}
    for head in warming.values():
        head.margin = margin_at_step(head.margin, 1, 2)
    for batch in steps:
        got, want = (head_step(warming[mode], 0, 1, *batch)[:3] for mode in ("untiled", "tiled"))
        for actual, reference in zip(got, want):
            assert_close(actual, reference)


def test_the_problem_exercises_the_margins():
    """The data reach the cases the margins distinguish: MagFace's clamps bind on some rows and not on
    others, CurricularFace finds hard negatives, ElasticFace's draws differ between rows and steps."""
    weight, steps = batches()
    norms = torch.cat([torch.linalg.vector_norm(x, dim=1) for x, _ in steps])
    assert (norms < 10).any() and (norms > 110).any() and ((norms > 10) & (norms < 110)).any()
    x, labels = steps[0]
    cos = F.normalize(x) @ F.normalize(weight).t()
    target = cos.gather(1, labels[:, None])
    assert bool((cos > torch.cos(torch.acos(target) + 0.5)).sum() > BATCH)  # beyond the targets themselves
    draws = [standard_normals(0, torch.tensor(step), torch.arange(BATCH)) for step in (1, 2)]
    assert draws[0].unique().numel() == BATCH and not torch.equal(*draws)


# ---- resume and reshard -------------------------------------------------------------------------


def resume_worker(rank, world_size, mode):
    """Per margin: the straight run's steps 2-3, and those of a head rebuilt from the state dict after
    step 1 (another initial weight, so only the loaded state can make them equal)."""
    weight, steps = batches()
    results = {}
    for name in ROW_MARGINS:
        straight = sharded_head(name, mode, weight)
        first = head_step(straight, rank, world_size, *steps[0])
        saved = {k: v.clone() for k, v in straight.state_dict().items()}
        later = [head_step(straight, rank, world_size, *batch) for batch in steps[1:]]
        resumed = sharded_head(name, mode, torch.zeros_like(weight))
        resumed.load_state_dict(saved)
        again = [head_step(resumed, rank, world_size, *batch) for batch in steps[1:]]
        results[name] = (first, later, again)
    return results


@pytest.mark.parametrize("mode", list(MODES))
def test_a_state_dict_round_trip_resumes_bit_exact(mode):
    for results in run_distributed(resume_worker, 2, mode, timeout=240):
        for name, (first, later, again) in results.items():
            assert bool(first[3]) == (name != "magface"), name  # the others keep running state
            for straight, resumed in zip(later, again):
                for a, b in zip(straight[:3], resumed[:3]):
                    assert torch.equal(a, b), name
                assert all(torch.equal(straight[3][k], resumed[3][k]) for k in straight[3]), name


def checkpoint_parts(name, seed):
    from facetrain.train.optim import build_optimizer
    from facetrain.train.run_config import Config

    torch.manual_seed(seed)
    backbone = torch.nn.Sequential(torch.nn.Linear(DIM, DIM)).double()
    head = ShardedMarginHead(CLASSES, DIM, margin=name, scale=SCALE).double()
    head.reset_parameters(seed=seed)
    return backbone, head, build_optimizer(Config().optim, backbone, head)


def reshard_save_worker(rank, world_size, run_dir, name):
    from facetrain.checkpoint import CheckpointStates
    from facetrain.checkpoint.writer import save_checkpoint
    from facetrain.parallel.dims import init_parallel
    from facetrain.train.run_config import Config
    from facetrain.train.state import TrainState

    backbone, head, optimizer = checkpoint_parts(name, seed=0)
    _, steps = batches()
    for embeddings, labels in steps[:2]:
        rows = local_rows(world_size, rank, BATCH)
        loss, _ = head(backbone(embeddings[rows]), labels[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    cfg = Config()
    cfg.model.embedding_size, cfg.head.margin = DIM, name
    state, names = TrainState(step=2, epoch=0, consumed=2 * BATCH), list(map(str, range(CLASSES)))
    save_checkpoint(
        run_dir, init_parallel(), CheckpointStates(state, cfg, names, backbone, head, optimizer, None)
    )
    return {k: v.clone() for k, v in head.margin_state.named_buffers()}


def reshard_load_worker(rank, world_size, run_dir, name):
    from facetrain.checkpoint.reader import load_checkpoint
    from facetrain.parallel.dims import init_parallel

    backbone, head, optimizer = checkpoint_parts(name, seed=1)
    load_checkpoint(run_dir, init_parallel(), backbone, head, optimizer, None)
    return {k: v.clone() for k, v in head.margin_state.named_buffers()}


@pytest.mark.parametrize("name", ["adaface", "curricularface"])
def test_running_state_survives_a_checkpoint_reshard(tmp_path, name):
    saved = run_distributed(reshard_save_worker, 2, tmp_path, name)
    assert saved[0].keys() and all(not torch.equal(v, checkpoint_parts(name, 0)[1].margin_state.get_buffer(k))
                                   for k, v in saved[0].items())  # fmt: skip
    for rank_state in run_distributed(reshard_load_worker, 3, tmp_path, name):
        assert rank_state.keys() == saved[0].keys()
        for key in saved[0]:
            assert torch.equal(rank_state[key], saved[0][key]) and torch.equal(saved[1][key], saved[0][key])


# ---- draws, warmup, modes -----------------------------------------------------------------------


def test_elastic_draws_follow_their_normal_and_the_valid_rows():
    z = standard_normals(3, torch.tensor(5), torch.arange(200_000))
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert torch.equal(z[:10], standard_normals(3, torch.tensor(5), torch.arange(10)))
    assert not torch.equal(z[:10], standard_normals(4, torch.tensor(5), torch.arange(10)))
    # padding rows (a short rank's) are skipped: the draws follow the valid rows in order
    from facetrain.heads.margins import prepare_step

    margin = build_margin("elasticface_cos", seed=3)
    valid = torch.tensor([True, True, False, True, False, False, True])
    step = prepare_step(
        margin, {"step": torch.tensor(4)}, torch.ones(7, dtype=torch.float64), valid, None, True
    )
    drawn = margin.margins(step.rows, step.state)[valid]
    assert torch.equal(drawn, 0.35 + 0.05 * standard_normals(3, torch.tensor(5), torch.arange(4)))


@pytest.mark.parametrize("name", ROW_MARGINS)
def test_the_dense_head_with_a_warming_margin_blends_towards_the_full_one(name):
    weight, steps = batches()
    losses = []
    for factor_step in (0, 50, 100):
        head = DenseMarginHead(CLASSES, DIM, margin=name, scale=SCALE).double()
        head.weight.data.copy_(weight)
        head.margin = margin_at_step(head.margin, factor_step, 100)
        losses.append(float(head(*steps[0]).loss.detach()))
    softmax = DenseMarginHead(CLASSES, DIM, margin="softmax", scale=SCALE).double()
    softmax.weight.data.copy_(weight)
    assert losses[0] == pytest.approx(float(softmax(*steps[0]).loss.detach()), rel=1e-12)
    assert losses[0] != losses[1] != losses[2]


def test_evaluation_mode_leaves_the_running_state_alone():
    weight, steps = batches()
    head = sharded_head("adaface", "untiled", weight)
    before = {k: v.clone() for k, v in head.margin_state.named_buffers()}
    head.eval()
    head(*steps[0])
    assert all(torch.equal(v, before[k]) for k, v in head.margin_state.named_buffers())
    head.train()
    head(*steps[0])
    assert not torch.equal(head.margin_state.batch_mean, before["batch_mean"])


def triton_worker(rank, world_size):
    weight, steps = batches()
    plan = HeadPlan("tiled", 20, kernel="triton")
    results = {}
    for name in ROW_MARGINS:
        head = ShardedMarginHead(CLASSES, DIM, margin=name, scale=SCALE, plan=plan, gradient_reduction="sum")
        with torch.no_grad():
            head.weight.copy_(weight[head.class_start : head.class_stop].float())
        results[name] = [
            head_step(head, rank, world_size, embeddings.float(), labels) for embeddings, labels in steps
        ]
    return results


@pytest.mark.parametrize("world_size", [1, 2])
def test_triton_tiles_take_the_adaptive_margins(world_size):
    """The Triton tiles (the interpreter on the CPU; tiles of 20 over blocks of 16) in fp32, the running
    state included, against the fp64 references to fp32 rounding (1e-5 of each quantity's magnitude)."""
    triton_tile = pytest.importorskip("facetrain.heads.triton_tile")
    if not triton_tile.INTERPRETED:
        pytest.skip("Triton was compiled for the GPU in this process; the CPU cases need its interpreter")
    per_rank = [triton_worker(0, 1)] if world_size == 1 else run_distributed(triton_worker, 2, timeout=240)
    weight, steps = batches()
    for name in ROW_MARGINS:
        for step, (loss, grad_x, grad_w, state) in enumerate(reference_run(name, weight, steps)):
            got = [rank_results[name][step] for rank_results in per_rank]
            for actual, expected in [
                (got[0][0], loss),
                (torch.cat([r[1] for r in got]), grad_x),
                (torch.cat([r[2] for r in got]), grad_w),
                *[(got[0][3][key], state[key]) for key in state],
            ]:
                error = float((actual.double() - expected.double()).abs().max())
                assert error <= 1e-5 * max(1.0, float(expected.double().abs().max())), name


def test_only_the_classic_margins_go_to_heads_that_give_no_norms_or_state():
    classic = {"arcface", "cosface", "am_softmax", "sphereface", "combined", "softmax"}
    for name in ("arcface", "cosface", "sphereface", "combined", "softmax", "adaface", "magface",
                 "curricularface", "elasticface_arc", "elasticface_cos"):  # fmt: skip
        assert build_margin(name).of_the_cosine_alone == (name in classic), name
    assert not margin_at_step(build_margin("arcface"), 1, 10).of_the_cosine_alone  # reads the target cos
    NaiveModelParallelHead(10, 4, margin="arcface")
    with pytest.raises(ValueError, match="classic margins only, not 'curricularface'"):
        NaiveModelParallelHead(10, 4, margin="curricularface")  # would silently drop its modulation
