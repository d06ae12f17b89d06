"""Knowledge distillation (`loss.teacher`): the term against a plain reference, a frozen teacher, a
tiny run distilled from an earlier one (which it leaves untouched) that resumes exactly, and the
one-line refusals; the per-image cache of the teacher's embeddings (`loss.teacher_cache`)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from facetrain.checkpoint import resolve_checkpoint
from facetrain.errors import EveryRankError
from facetrain.interop import load_model
from facetrain.train import distillation
from facetrain.train.distillation import Distillation, TeacherCache, build_distillation, pin_teacher
from facetrain.train.losses import LossConfig
from facetrain.train.run_config import checkpoint_config
from facetrain.train.step import StepParts, StepSettings, train_step
from tests.support.distributed import run_distributed
from tests.support.train_helpers import logged_losses, run_cli, tiny_config, trained_tiny_run


def tiny_model(seed: int, size: int = 8) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * size * size, 6)).double()


def images(size: int = 8) -> torch.Tensor:
    return torch.randn(5, 3, size, size, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def reference(student: torch.Tensor, teacher: torch.Tensor, kind: str) -> torch.Tensor:
    cosines = torch.stack([s @ t / (s.norm() * t.norm()) for s, t in zip(student, teacher)])
    if kind == "cosine":
        return (1 - cosines).mean()
    distances = [(s / s.norm() - t / t.norm()).pow(2).sum() for s, t in zip(student, teacher)]
    return torch.stack(distances).mean()


@pytest.mark.parametrize("kind", ["cosine", "l2"])
def test_the_term_equals_the_reference_and_its_gradient_reaches_the_student_alone(kind):
    student, teacher, batch = tiny_model(0), tiny_model(1), images()
    distillation = Distillation(teacher, (8, 8), kind, weight=0.5)
    outputs = student(batch)
    term = distillation(batch, outputs)
    expected = 0.5 * reference(outputs.detach().requires_grad_(), teacher(batch).detach(), kind)
    assert term.item() == pytest.approx(expected.item(), rel=1e-6) and term.item() > 0
    (gradient,) = torch.autograd.grad(term, outputs)
    (expected_gradient,) = torch.autograd.grad(
        0.5 * reference(outputs, teacher(batch).detach(), kind), outputs
    )
    torch.testing.assert_close(gradient.double(), expected_gradient, rtol=1e-5, atol=1e-8)
    assert all(not p.requires_grad and p.grad is None for p in teacher.parameters())
    assert not teacher.training


def test_a_train_step_moves_the_student_and_leaves_the_teacher_exactly(tmp_path):
    student, teacher, batch = tiny_model(0).float(), tiny_model(1, size=4).float(), images().float()
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student_before = {k: v.clone() for k, v in student.state_dict().items()}
    optimizer = torch.optim.SGD(student.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    def head(outputs, labels):  # a loss of zero, so only the teacher's term moves the student
        return outputs.sum() * 0, torch.zeros(())

    settings = StepSettings(torch.device("cpu"))
    # the teacher takes 4x4 images: the 8x8 batch is resized for it
    parts = StepParts(
        student, head, optimizer, scaler, settings, distillation=Distillation(teacher, (4, 4), "cosine", 1.0)
    )
    result = train_step(iter([(batch, torch.zeros(5, dtype=torch.long))]), parts)
    assert result.loss.item() > 0
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert any(not torch.equal(student_before[k], v) for k, v in student.state_dict().items())


def digest(folder: Path) -> dict[str, str]:
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory) -> Path:
    return trained_tiny_run(tmp_path_factory.mktemp("teacher"), steps=3)


def test_a_distilled_run_logs_the_term_leaves_its_teacher_and_resumes_exactly(teacher_run, tmp_path):
    teacher = teacher_run / "run"
    teacher_files = digest(teacher)
    data = {"path": str(teacher_run / "synth")}
    train, checkpoint = {"steps": 4}, {"every": 2}
    plain = tiny_config(tmp_path, "plain", data=data, train=train, checkpoint=checkpoint)
    assert run_cli("train", "-c", str(plain)).returncode == 0
    distilled = {}
    for name, weight in (("straight", 1.0), ("double", 2.0)):
        loss = {"teacher": str(teacher), "teacher_weight": weight}
        config = tiny_config(tmp_path, name, data=data, train=train, checkpoint=checkpoint, loss=loss)
        result = run_cli("train", "-c", str(config))
        assert result.returncode == 0, result.stderr
        distilled[name] = logged_losses(tmp_path / name)
    # step 1 starts from the same student on the same batch: the logged loss is the margin loss plus
    # weight x the term
    first_term = distilled["straight"][0] - logged_losses(tmp_path / "plain")[0]
    assert first_term > 0
    assert distilled["double"][0] - logged_losses(tmp_path / "plain")[0] == pytest.approx(
        2 * first_term, rel=1e-4
    )
    assert digest(teacher) == teacher_files

    halves = tiny_config(
        tmp_path, "halves", data=data, train={**train, "steps": 2}, loss={"teacher": str(teacher)}
    )
    assert run_cli("train", "-c", str(halves)).returncode == 0
    result = run_cli("train", "-c", str(halves), "--set", "train.steps=4", "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert logged_losses(tmp_path / "halves") == pytest.approx(distilled["straight"], abs=1e-6)
    expected, resumed = (
        load_model(tmp_path / "straight").module.state_dict(),
        load_model(tmp_path / "halves").module.state_dict(),
    )
    for key, value in expected.items():
        torch.testing.assert_close(resumed[key], value, rtol=0, atol=1e-6, msg=key)


def test_a_missing_teacher_and_another_embedding_size_are_one_line(teacher_run, tmp_path):
    data = {"path": str(teacher_run / "synth")}
    missing = tiny_config(tmp_path, "missing", data=data, loss={"teacher": str(tmp_path / "nothing")})
    result = run_cli("train", "-c", str(missing))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "loss.teacher" in lines[0] and "does not exist" in lines[0]
    other = tiny_config(
        tmp_path, "other", data=data, model={"embedding_size": 16}, loss={"teacher": str(teacher_run / "run")}
    )
    result = run_cli("train", "-c", str(other))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert (
        lines[0].startswith("error: loss.teacher: ")
        and "32-d" in lines[0]
        and "model.embedding_size=32" in lines[0]
    )


class CountingTeacher(nn.Module):
    """`tiny_model`'s linear map that counts the images it embeds."""

    def __init__(self, seed: int, size: int = 8):
        super().__init__()
        self.model, self.images = tiny_model(seed, size).float(), 0

    def forward(self, images):
        self.images += len(images)
        return self.model(images)


def test_the_cache_runs_the_teacher_once_per_sample_and_gives_what_it_gave():
    """Rows missing from the cache go through the teacher, rows seen before are read back: the same
    embeddings as the teacher's on the whole batch, in the batch's order, repeated indices included."""
    teacher = CountingTeacher(1)
    dataset = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    cached = Distillation(teacher, (8, 8), "cosine", 1.0, TeacherCache(10, 6, torch.device("cpu")))
    assert (
        cached.cache.bytes == 10 * 6 * 4
        and "up to 10 teacher embeddings of size 6" in cached.cache.describe()
    )
    for batch, computed in (([0, 1, 2, 3], 4), ([2, 3, 4, 5], 2), ([5, 4, 3, 2], 0), ([9, 0, 9, 6], 2)):
        indices = torch.tensor(batch)
        before = teacher.images
        embeddings = cached.cache.embeddings(indices, dataset[indices], cached.teacher_embeddings)
        assert teacher.images - before == computed
        with torch.no_grad():
            torch.testing.assert_close(embeddings, teacher.model(dataset[indices]), rtol=1e-6, atol=1e-7)
    assert cached.cache.computed == 8 and cached.cache.served == 8
    assert cached.cache.filled.sum() == 8
    student = tiny_model(0).float()(dataset[:4])
    plain = Distillation(teacher.model, (8, 8), "cosine", 1.0)
    assert cached(dataset[:4], student, torch.arange(4)).item() == pytest.approx(
        plain(dataset[:4], student).item(), rel=1e-6
    )
    with pytest.raises(ValueError, match="sample indices"):
        cached(dataset[:4], student)


def test_a_cached_run_equals_the_uncached_one(teacher_run, tmp_path):
    """Six steps of 32 of the 96 images: the second epoch reads every teacher embedding from the cache,
    and the losses and the weights are those of the run that computes them at every step."""
    teacher = str(teacher_run / "run")
    data = {"path": str(teacher_run / "synth"), "augment": {"horizontal_flip": False}}
    train, checkpoint = {"steps": 6, "batch_size": 32}, {"every": 6}
    runs = {}
    for name, cache in (("computed", False), ("cached", True)):
        config = tiny_config(
            tmp_path,
            name,
            data=data,
            train=train,
            checkpoint=checkpoint,
            loss={"teacher": teacher, "teacher_cache": cache},
        )
        result = run_cli("train", "-c", str(config))
        assert result.returncode == 0, result.stderr
        runs[name] = result.stdout + result.stderr
    assert "loss.teacher_cache: up to 96 teacher embeddings of size 32 kept, 0.0 MiB of cpu" in runs["cached"]
    assert "loss.teacher_cache" not in runs["computed"]
    assert logged_losses(tmp_path / "cached") == logged_losses(tmp_path / "computed")
    computed, cached = (load_model(tmp_path / name).module.state_dict() for name in ("computed", "cached"))
    for key, value in computed.items():
        assert torch.equal(cached[key], value), key


def test_a_cache_with_random_augmentation_or_without_a_teacher_is_one_line(teacher_run, tmp_path):
    data = {"path": str(teacher_run / "synth"), "augment": {"horizontal_flip": True, "blur": 0.2}}
    augmented = tiny_config(
        tmp_path, "augmented", data=data, loss={"teacher": str(teacher_run / "run"), "teacher_cache": True}
    )
    alone = tiny_config(
        tmp_path, "alone", data={"path": str(teacher_run / "synth")}, loss={"teacher_cache": True}
    )
    for config, expected in (
        (
            augmented,
            "turn off data.augment.horizontal_flip, data.augment.blur or set loss.teacher_cache: false",
        ),
        (alone, "needs loss.teacher"),
    ):
        result = run_cli("train", "-c", str(config))
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "loss.teacher_cache" in lines[0] and expected in lines[0]


def moved_on(run: Path, step: int) -> Path:
    """`run` as if it had trained on to `step`: its last checkpoint copied there (other weights do not
    matter: which checkpoint is read is what is checked) and `last` pointing at it."""
    checkpoints = run / "checkpoints"
    newer = checkpoints / f"step_{step:08d}"
    shutil.copytree(resolve_checkpoint(run), newer)
    (checkpoints / "last").write_text(newer.name)
    return newer


def test_a_run_folder_teacher_is_pinned_at_the_start_and_every_resume_keeps_it(teacher_run, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run / "run", teacher)
    pinned = resolve_checkpoint(teacher)
    data = {"path": str(teacher_run / "synth")}
    train, checkpoint = {"steps": 2}, {"every": 2}
    config = tiny_config(
        tmp_path, "student", data=data, train=train, checkpoint=checkpoint, loss={"teacher": str(teacher)}
    )
    result = run_cli("train", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert f"loss.teacher: {teacher} resolved to {pinned}" in result.stdout + result.stderr
    student = tmp_path / "student"
    assert yaml.safe_load((student / "config.yaml").read_text())["loss"]["teacher"] == str(pinned)
    assert checkpoint_config(resolve_checkpoint(student)).loss.teacher == str(pinned)

    moved_on(teacher, 9)  # the teacher run trains on: the resume keeps learning from the pinned one
    result = run_cli("train", "-c", str(config), "--set", "train.steps=4", "--resume", "auto")
    assert result.returncode == 0, result.stderr
    assert "resolved to" not in result.stdout + result.stderr
    assert checkpoint_config(resolve_checkpoint(student)).loss.teacher == str(pinned)

    shutil.rmtree(pinned)  # pruned by the teacher run: refused, not silently replaced by step 9
    result = run_cli("train", "-c", str(config), "--set", "train.steps=6", "--resume", "auto")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert str(pinned) in lines[0] and "is gone" in lines[0] and "--set loss.teacher=" in lines[0]


@pytest.mark.parametrize("suffix", [".tmp", ".deleting", ".replaced"])
def test_a_teacher_is_read_from_a_finished_checkpoint_only(teacher_run, tmp_path, suffix):
    """A checkpoint is written as step_N.tmp and renamed once whole, so a finished one never changes; one
    being written (even with its index and meta.json already there), removed or replaced is refused in
    one line, and a run folder holding one resolves to its newest finished checkpoint."""
    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_run / "run", teacher)
    finished = resolve_checkpoint(teacher)
    unfinished = teacher / "checkpoints" / f"step_00000009{suffix}"
    shutil.copytree(finished, unfinished)
    (teacher / "checkpoints" / "last").unlink()  # a pointer lost too: the newest finished one is taken
    loss = LossConfig(teacher=str(teacher))
    assert pin_teacher(loss, None) == f"loss.teacher: {teacher} resolved to {finished}"
    assert loss.teacher == str(finished)
    with pytest.raises(EveryRankError) as refused:
        build_distillation(LossConfig(teacher=str(unfinished)), 32, torch.device("cpu"))
    message = str(refused.value)
    assert "\n" not in message and str(unfinished) in message and "still writing or removing" in message


def _pinned_on_a_rank(rank: int, world_size: int, teacher: str, committed_later: str) -> str:
    """Rank `rank`'s pinned teacher, where rank 1's look-up would come after the teacher run committed
    `committed_later` (its resolver is made to see it; rank 0 sees the run as it is)."""
    with pytest.MonkeyPatch.context() as patch:
        if rank == 1:
            patch.setattr(distillation, "checkpoint_behind", lambda path: Path(committed_later))
        loss = LossConfig(teacher=teacher)
        pin_teacher(loss, None)
    return loss.teacher


def test_every_rank_learns_from_the_checkpoint_rank_0_pinned(tmp_path):
    """Each rank looked the run-folder teacher up for itself: a teacher run committing a checkpoint
    between two ranks' look-ups gave them different teachers. Rank 0 pins it for all."""
    teacher = tmp_path / "teacher"
    pinned = teacher / "checkpoints" / "step_00000002"
    pinned.mkdir(parents=True)
    (pinned / ".metadata").touch()
    (pinned / "meta.json").touch()
    later = teacher / "checkpoints" / "step_00000009"
    assert run_distributed(_pinned_on_a_rank, 2, str(teacher), str(later)) == [str(pinned), str(pinned)]
