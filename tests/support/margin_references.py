"""The quality-aware and curriculum margins (AdaFace, MagFace, CurricularFace, ElasticFace) written
plainly from their papers, with the batches they are checked on: the dense references the margin and
label-smoothing tests compare the sharded head against (no tests here)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from facetrain.heads.margins.elasticface import standard_normals

CLASSES, DIM, BATCH, STEPS, SCALE = 23, 12, 10, 3, 64.0
EXACT = 1e-10


def batches():
    """STEPS batches whose embedding norms spread over [3, 150] (MagFace's clamps to [10, 110] bind on
    some rows, AdaFace's normalised norms differ), and a weight."""
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(CLASSES, DIM, generator=generator, dtype=torch.float64) * 0.05
    steps = []
    for _ in range(STEPS):
        direction = F.normalize(torch.randn(BATCH, DIM, generator=generator, dtype=torch.float64), dim=1)
        norm = torch.exp(
            torch.empty(BATCH, dtype=torch.float64).uniform_(math.log(3), math.log(150), generator=generator)
        )
        labels = torch.randint(0, CLASSES, (BATCH,), generator=generator)
        steps.append((direction * norm[:, None], labels))
    return weight, steps


def reference_logits(name, cos, norm, labels, state):
    """The dense logits / s of the paper's loss, the extra loss term, and the new running state."""
    target = cos.gather(1, labels[:, None]).squeeze(1)
    onehot = F.one_hot(labels, cos.shape[1]).bool()
    extra = torch.zeros((), dtype=cos.dtype)
    if name == "adaface":  # Kim et al. 2022, eqs. 6-8, with the authors' clips and momentum
        eps, m, h, alpha = 1e-3, 0.4, 0.333, 0.01
        safe = norm.detach().clamp(0.001, 100)
        state = {
            "batch_mean": alpha * safe.mean() + (1 - alpha) * state["batch_mean"],
            "batch_std": alpha * safe.std() + (1 - alpha) * state["batch_std"],
        }
        z_hat = ((safe - state["batch_mean"]) / (state["batch_std"] + eps) * h).clamp(-1, 1)
        g_angle, g_add = -m * z_hat, m * z_hat + m
        theta = torch.acos(target.clamp(-1 + eps, 1 - eps))
        penalised = torch.cos((theta + g_angle).clamp(eps, math.pi - eps)) - g_add
    elif name == "magface":  # Meng et al. 2021, eqs. 3-5: m(a) linear, g(a) = 1/a + a/u_a^2
        l_a, u_a, l_m, u_m, lambda_g = 10.0, 110.0, 0.45, 0.8, 35.0
        a = norm.clamp(l_a, u_a)
        m = (u_m - l_m) / (u_a - l_a) * (a - l_a) + l_m
        penalised = torch.where(target > 0, torch.cos(torch.acos(target) + m), target)
        extra = lambda_g * (1 / a + a / u_a**2).mean()
    elif name == "curricularface":  # Huang et al. 2020, eqs. 8-10, t updated before use
        m = 0.5
        state = {"t": 0.01 * target.detach().mean() + 0.99 * state["t"]}
        unfolded = torch.cos(torch.acos(target) + m)
        penalised = torch.where(target > math.cos(math.pi - m), unfolded, target - m * math.sin(math.pi - m))
        hard = (cos > unfolded.detach()[:, None]) & ~onehot
        cos = torch.where(hard, cos * (state["t"] + cos), cos)
    else:  # Boutros et al. 2022, eqs. 3-4: m_i ~ N(m, sigma) per sample
        state = {"step": state["step"] + 1}
        m = (0.5 if name == "elasticface_arc" else 0.35) + 0.05 * standard_normals(
            0, state["step"], torch.arange(len(labels))
        )
        arc = name == "elasticface_arc"
        penalised = torch.cos(torch.acos(target) + m) if arc else target - m
    return torch.where(onehot, penalised[:, None], cos), extra, state


def assert_close(actual, expected):
    scale = max(1.0, float(expected.double().abs().max()))
    assert float((actual.double() - expected.double()).abs().max()) <= EXACT * scale
