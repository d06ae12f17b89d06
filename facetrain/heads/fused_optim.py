"""The tiled head's own optimizer: each tile of classes is updated inside the backward, as soon as its
weight gradient exists, so no C x D gradient is ever allocated.

The arithmetic is torch.optim's, step for step (`torch.optim.SGD` with momentum and weight decay,
`torch.optim.AdamW` with bias correction), run in fp32 (fp64 for fp64 weights) on one tile at a time
and written back into the storage dtype, stochastically rounded when that is bf16. State tensors carry
torch's names (`momentum_buffer`, `exp_avg`, `exp_avg_sq`, `step`), so checkpoints hold the same
entries whichever head wrote them.

Only the rows a step computes are updated. With Partial FC that is the sampled rows: rows not sampled
keep their weight and state unchanged that step (lazy semantics, as torch.optim.SparseAdam; AdamW's
bias correction counts every step, as SparseAdam's does).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from facetrain.errors import FacetrainError
from facetrain.heads.class_rows import ClassRows
from facetrain.registry import Registry


class FusedOptimizer(nn.Module):
    """Per-class state of one shard (`rows` x `dim`) and the update of one tile of it.

    `lr` is set by the trainer before every step (the schedule's value for the head's group).
    """

    state_names: tuple[str, ...] = ()

    def __init__(
        self, rows: int, dim: int, lr: float, weight_decay: float, state_dtype: torch.dtype = torch.float32
    ):
        super().__init__()
        self.lr = float(lr)
        self.weight_decay = float(weight_decay)
        self.steps = 0
        for name in self.active_state_names():
            self.register_buffer(name, torch.zeros(rows, dim, dtype=state_dtype), persistent=False)

    def active_state_names(self) -> tuple[str, ...]:
        return self.state_names

    @property
    def name(self) -> str:
        raise NotImplementedError

    def begin_step(self) -> None:
        """Called once per step, before the first tile's update."""
        self.steps += 1

    def update(
        self,
        weight: torch.Tensor,
        rows: ClassRows,
        current: torch.Tensor,
        raw_grad: torch.Tensor,
        radial: torch.Tensor,
    ) -> None:
        """Update `rows` of `weight` and of the state.

        `current` holds those rows as read for this step's arithmetic (a view of `weight` where no
        conversion was needed); the loss's gradient for them is `raw_grad - radial[:, None] * current`
        (the gradient through the weight normalisation, left unassembled so the optimizer can fold it
        into its first pass). `raw_grad` may be overwritten.
        """
        raise NotImplementedError

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Checkpoint entries: per-class tensors (rows x dim) and scalars, under torch.optim's names."""
        return {name: getattr(self, name) for name in self.active_state_names()}

    def load_state_tensors(self, values: dict[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` gave (possibly resharded); state the checkpoint lacks stays 0."""
        unknown = sorted(set(values) - set(self.active_state_names()) - {"step"})
        if unknown:
            raise FacetrainError(
                f"the checkpoint's head optimizer state has {', '.join(unknown)}, which optim.name="
                f"{self.name} does not keep; resume with the optimizer the run was trained with"
            )
        with torch.no_grad():
            for name in self.active_state_names():
                if name in values:
                    getattr(self, name).copy_(values[name])

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.state_tensors().values() if t.dim())


FUSED_OPTIMIZERS: Registry[FusedOptimizer] = Registry("fused head optimizer")


@FUSED_OPTIMIZERS.register("sgd")
class FusedSGD(FusedOptimizer):
    """torch.optim.SGD: d_p = g + wd w; buf = momentum buf + d_p (buf = d_p the first time); w -= lr buf.

    A zero buffer makes the first step's buf = d_p exactly, so no first-step branch is needed. With
    momentum 0 there is no buffer at all, as in torch.
    """

    state_names = ("momentum_buffer",)

    def __init__(
        self,
        rows: int,
        dim: int,
        lr: float,
        weight_decay: float = 0.0,
        state_dtype: torch.dtype = torch.float32,
        momentum: float = 0.9,
    ):
        self.momentum = float(momentum)
        super().__init__(rows, dim, lr, weight_decay, state_dtype)

    @property
    def name(self) -> str:
        return "sgd"

    def active_state_names(self) -> tuple[str, ...]:
        return self.state_names if self.momentum else ()

    def update(self, weight, rows, current, raw_grad, radial) -> None:
        # d_p = (raw_grad - radial w) + wd w in one pass
        step_direction = raw_grad.addcmul_(current, (self.weight_decay - radial)[:, None])
        if self.momentum:
            buffer = rows.read(self.momentum_buffer, current.dtype)
            step_direction = torch.add(step_direction, buffer, alpha=self.momentum, out=buffer)
            rows.write(self.momentum_buffer, buffer)
        current.add_(step_direction, alpha=-self.lr)
        rows.write(weight, current)


@FUSED_OPTIMIZERS.register("adamw")
class FusedAdamW(FusedOptimizer):
    """torch.optim.AdamW: decoupled weight decay, moment averages with bias correction, eps outside
    the square root."""

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        rows: int,
        dim: int,
        lr: float,
        weight_decay: float = 0.0,
        state_dtype: torch.dtype = torch.float32,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ):
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        super().__init__(rows, dim, lr, weight_decay, state_dtype)

    @property
    def name(self) -> str:
        return "adamw"

    def update(self, weight, rows, current, raw_grad, radial) -> None:
        beta1, beta2 = self.betas
        grad = raw_grad.addcmul_(current, radial[:, None], value=-1.0)
        if self.weight_decay:
            current.mul_(1 - self.lr * self.weight_decay)
        exp_avg = rows.read(self.exp_avg, current.dtype).lerp_(grad, 1 - beta1)
        exp_avg_sq = rows.read(self.exp_avg_sq, current.dtype)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = self.lr / (1 - beta1**self.steps)
        denominator = grad  # reuse the tile's buffer: the gradient is no longer needed
        torch.sqrt(exp_avg_sq, out=denominator).div_(math.sqrt(1 - beta2**self.steps)).add_(self.eps)
        current.addcdiv_(exp_avg, denominator, value=-step_size)
        rows.write(self.exp_avg, exp_avg)
        rows.write(self.exp_avg_sq, exp_avg_sq)
        rows.write(weight, current)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {**super().state_tensors(), "step": torch.tensor(float(self.steps))}

    def load_state_tensors(self, values: dict[str, torch.Tensor]) -> None:
        super().load_state_tensors(values)
        if "step" in values:
            self.steps = int(values["step"])
