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

from facetrain.errors import FacetrainError
from facetrain.heads.class_rows import ClassRows
from facetrain.heads.row_stream import RowStream
from facetrain.registry import Registry


class FusedOptimizer(torch.optim.Optimizer):
    """A `torch.optim.Optimizer` over the tiled head's weight whose update runs inside the head's backward.

    Build it over the weight and hand it to the head, then use it as any optimizer:

        head_optimizer = FusedSGD([head.weight], lr=0.1, momentum=0.9, weight_decay=5e-4)
        head.fuse_optimizer(head_optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(head_optimizer, schedule)

    `step()` does nothing (the backward already applied the update, with the learning rate and weight
    decay of the parameter group at that time), so LR schedulers, `zero_grad`, `state_dict` /
    `load_state_dict` and torch.distributed.checkpoint's optimizer state dicts work unchanged. The state
    lives in `state[weight]` under torch's names, in `state_dtype` (float32 by default, the weight's
    dtype for float64 weights; bf16 halves it for bf16 weights), created at the first update on the
    weight's device.
    """

    state_names: tuple[str, ...] = ()

    def __init__(self, params, lr: float, weight_decay: float = 0.0, state_dtype: torch.dtype | None = None,
                 **hyperparameters: float):  # fmt: skip
        super().__init__(params, {"lr": float(lr), "weight_decay": float(weight_decay), **hyperparameters})
        weights = [param for group in self.param_groups for param in group["params"]]
        if len(weights) != 1:
            raise FacetrainError(
                f"a fused head optimizer updates one weight, the tiled head's, not {len(weights)}: "
                "FusedSGD([head.weight], lr=...)"
            )
        self.weight = weights[0]
        default = torch.float64 if self.weight.dtype == torch.float64 else torch.float32
        self.state_dtype = state_dtype or default

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def group(self) -> dict:
        return self.param_groups[0]

    def active_state_names(self) -> tuple[str, ...]:
        return self.state_names

    def step(self, closure=None):
        """Nothing to do: the backward updated the weight. Calls `closure` if given, as torch's do."""
        if closure is not None:
            with torch.enable_grad():
                return closure()
        return None

    def per_class_state(self, name: str) -> torch.Tensor:
        """The weight-shaped state `name`, zeros until written, on the weight's device."""
        state = self.state[self.weight]
        value = state.get(name)
        if value is None or value.device != self.weight.device:
            value = (
                torch.zeros(self.weight.shape, dtype=self.state_dtype, device=self.weight.device)
                if value is None
                else value.to(self.weight.device)
            )
            state[name] = value
        return value

    def begin_step(self) -> None:
        """Called once per step, before the first tile's update."""

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

    def single_pass_update(self, weight: torch.Tensor, rows: ClassRows, raw_grad: torch.Tensor,
                           inv_norm: torch.Tensor, stream: RowStream | None = None) -> bool:  # fmt: skip
        """Update `rows` as `update` would, in one Triton pass that also forms the radial part from
        `raw_grad` and the rows' inverse norms `inv_norm`, where this optimizer has such a kernel for
        these tensors; False (nothing done) otherwise, and the caller runs `update`. The tiled head asks
        only when its kernel is Triton's (CUDA inputs, or Triton's interpreter). With a `stream` (only
        where `keeps_stream` said so), the pass also writes its bf16 copy of the rows."""
        return False

    def keeps_stream(self, weight: torch.Tensor) -> bool:
        """Whether `single_pass_update` takes these rows and so can keep a `RowStream` of them in step;
        without, the copy would be made again every step (a pass over C x D), so the head streams none."""
        return False

    def load_state_tensors(self, values: dict[str, torch.Tensor]) -> None:
        """Restore per-class state (possibly resharded) and `step`; state the values lack stays 0."""
        unknown = sorted(set(values) - set(self.active_state_names()) - {"step"})
        if unknown:
            raise FacetrainError(
                f"the checkpoint's head optimizer state has {', '.join(unknown)}, which optim.name="
                f"{self.name} does not keep; resume with the optimizer the run was trained with"
            )
        with torch.no_grad():
            for name in self.active_state_names():
                if name in values:
                    self.per_class_state(name).copy_(values[name])
        if "step" in values:
            self.state[self.weight]["step"] = torch.tensor(float(values["step"]))

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's, except that per-class state keeps `state_dtype` (torch would cast it to the weight's
        dtype: bf16 for a bf16 head, rounding an fp32 momentum)."""
        # the weight's key: its index, or its name in torch.distributed.checkpoint's state dicts
        key = state_dict["param_groups"][0]["params"][0]
        saved = dict(state_dict["state"].get(key, {}))
        super().load_state_dict(state_dict)
        for name in self.active_state_names():
            self.state[self.weight].pop(name, None)  # made again below, in state_dtype
        self.load_state_tensors(saved)


FUSED_OPTIMIZERS: Registry[FusedOptimizer] = Registry("fused head optimizer")


@FUSED_OPTIMIZERS.register("sgd")
class FusedSGD(FusedOptimizer):
    """torch.optim.SGD: d_p = g + wd w; buf = momentum buf + d_p (buf = d_p the first time); w -= lr buf.

    A zero buffer makes the first step's buf = d_p exactly, so no first-step branch is needed. With
    momentum 0 there is no buffer at all, as in torch.
    """

    state_names = ("momentum_buffer",)

    def __init__(self, params, lr: float, weight_decay: float = 0.0, state_dtype: torch.dtype | None = None,
                 momentum: float = 0.9):  # fmt: skip
        super().__init__(params, lr, weight_decay, state_dtype, momentum=float(momentum))

    @property
    def name(self) -> str:
        return "sgd"

    def active_state_names(self) -> tuple[str, ...]:
        return self.state_names if self.group["momentum"] else ()

    def update(self, weight, rows, current, raw_grad, radial) -> None:
        group = self.group
        # d_p = (raw_grad - radial w) + wd w in one pass
        step_direction = raw_grad.addcmul_(current, (group["weight_decay"] - radial)[:, None])
        if group["momentum"]:
            state = self.per_class_state("momentum_buffer")
            buffer = rows.read(state, current.dtype)
            step_direction = torch.add(step_direction, buffer, alpha=group["momentum"], out=buffer)
            rows.write(state, buffer)
        current.add_(step_direction, alpha=-group["lr"])
        rows.write(weight, current)

    def single_pass_update(self, weight, rows, raw_grad, inv_norm, stream=None) -> bool:
        """`triton_update.py`'s kernel over fp32 weight and momentum (Partial FC's rows included); bf16
        storage keeps the torch update, which rounds stochastically."""
        from facetrain.heads import triton_update  # triton is optional: imported by Triton heads only

        buffer = self.per_class_state("momentum_buffer") if self.group["momentum"] else None
        if not triton_update.takes(weight, buffer, raw_grad):
            return False
        triton_update.sgd_rows(weight, buffer, rows, raw_grad, inv_norm, self.group, stream)
        return True

    def keeps_stream(self, weight) -> bool:
        """fp32 weight and, with momentum, an fp32 buffer: what `triton_update.takes` (the raw gradient is
        fp32 under bf16 autocast)."""
        return weight.dtype == torch.float32 and (
            not self.group["momentum"] or self.state_dtype == torch.float32
        )


@FUSED_OPTIMIZERS.register("adamw")
class FusedAdamW(FusedOptimizer):
    """torch.optim.AdamW: decoupled weight decay, moment averages with bias correction, eps outside
    the square root."""

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float, weight_decay: float = 0.0, state_dtype: torch.dtype | None = None,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):  # fmt: skip
        super().__init__(params, lr, weight_decay, state_dtype, betas=(float(betas[0]), float(betas[1])),
                         eps=float(eps))  # fmt: skip

    @property
    def name(self) -> str:
        return "adamw"

    def begin_step(self) -> None:
        """Counts the step for the bias correction, in `state["step"]`, a CPU float32 scalar as torch
        keeps it."""
        state = self.state[self.weight]
        state["step"] = state.get("step", torch.tensor(0.0)) + 1

    def update(self, weight, rows, current, raw_grad, radial) -> None:
        group = self.group
        (beta1, beta2), lr, steps = group["betas"], group["lr"], int(self.state[self.weight]["step"])
        grad = raw_grad.addcmul_(current, radial[:, None], value=-1.0)
        if group["weight_decay"]:
            current.mul_(1 - lr * group["weight_decay"])
        exp_avg_state, exp_avg_sq_state = self.per_class_state("exp_avg"), self.per_class_state("exp_avg_sq")
        exp_avg = rows.read(exp_avg_state, current.dtype).lerp_(grad, 1 - beta1)
        exp_avg_sq = rows.read(exp_avg_sq_state, current.dtype)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = lr / (1 - beta1**steps)
        denominator = grad  # reuse the tile's buffer: the gradient is no longer needed
        torch.sqrt(exp_avg_sq, out=denominator).div_(math.sqrt(1 - beta2**steps)).add_(group["eps"])
        current.addcdiv_(exp_avg, denominator, value=-step_size)
        rows.write(exp_avg_state, exp_avg)
        rows.write(exp_avg_sq_state, exp_avg_sq)
        rows.write(weight, current)
