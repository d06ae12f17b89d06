"""Fine-tuning by depth: the first stages of a backbone frozen, the others learning at a rate that
decays with depth (optim.freeze_stages, optim.layer_decay), as parameter groups of the one optimizer.

A frozen parameter stops requiring a gradient before DDP wraps the backbone (DDP then leaves it out):
backward never computes its gradient, gradient clipping ignores it, and the optimizer holds it in a
group at learning rate 0 with nothing to update. The batch norms of a frozen stage stay in eval mode
(`set_train_mode`), so their running statistics stay the starting model's too. The groups are a pure
function of the config and the backbone's stages, rebuilt on resume, and the schedule scales each
group's own `initial_lr`: a resumed run has exactly the learning rates it would have had.
"""

from __future__ import annotations

from torch import nn

from facetrain.errors import FacetrainError
from facetrain.models.backbone import Stages, stage_of


def check_freeze_stages(count: int, stages: Stages) -> None:
    """The embedding layer always trains: at most the stages below it can be frozen."""
    below = len(stages) - 1
    if count > below:
        names = ", ".join(paths[0] for paths in stages[:-1])
        raise FacetrainError(
            f"optim.freeze_stages: {count} is more than this backbone's {below} stages below its embedding "
            f"layer ({names}); use at most {below}"
        )


def freeze_stages(module: nn.Module, stages: Stages, count: int) -> None:
    """Stop the parameters of the first `count` stages from requiring gradients (call it before a DDP
    wrapper is built: DDP reads which parameters require gradients once)."""
    check_freeze_stages(count, stages)
    for name, param in module.named_parameters():
        if stage_of(name, stages) < count:
            param.requires_grad_(False)


def backbone_groups(
    module: nn.Module, stages: Stages | None, lr: float, weight_decay: float, freeze: int, decay: float
) -> list[dict]:
    """The backbone's parameter groups; the first is always the one at the full backbone rate `lr`
    (the rate the trainer logs). Stage k of the n below the embedding layer learns at lr x decay^(n-k);
    the first `freeze` stages sit in one group at rate 0. Without freezing or decay, one group as ever.
    `module` may be a pipeline stage holding some of the stages: parameter names say which."""
    if freeze == 0 and decay == 1.0:
        return [
            {"params": list(module.parameters()), "weight_decay": weight_decay, "lr": lr, "name": "backbone"}
        ]
    if stages is None:
        raise ValueError("optim.freeze_stages and optim.layer_decay need a backbone that names its stages")
    check_freeze_stages(freeze, stages)
    below = len(stages) - 1
    by_stage: dict[int, list[nn.Parameter]] = {}
    for name, param in module.named_parameters():
        by_stage.setdefault(stage_of(name, stages), []).append(param)
    groups = [{"params": by_stage.get(below, []), "weight_decay": weight_decay, "lr": lr, "name": "backbone"}]
    frozen = [param for index in range(freeze) for param in by_stage.get(index, [])]
    if frozen:
        groups.append({"params": frozen, "weight_decay": weight_decay, "lr": 0.0, "name": "backbone.frozen"})
    for index in range(freeze, below):
        if index in by_stage:
            scaled = lr * decay ** (below - index)
            name = f"backbone.{stages[index][0]}"
            groups.append(
                {"params": by_stage[index], "weight_decay": weight_decay, "lr": scaled, "name": name}
            )
    return groups


def set_train_mode(module: nn.Module, mode: bool) -> None:
    """`module.train(mode)`, except that a batch norm whose parameters are all frozen keeps eval mode:
    a frozen stage normalises with the statistics it was trained with and does not update them."""
    module.train(mode)
    for child in module.modules():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            params = list(child.parameters(recurse=False))
            if params and not any(param.requires_grad for param in params):
                child.eval()
