"""The Hopkins statistic: does a set of points have cluster structure at all? (FedTSDP, "Federated Two Stage
Decoupling With Adaptive Personalization Layers", section 3.2.2, Eq. 6.)

Orientation as in Eq. 6: H ≈ 0.5 for points without structure, H → 1 for clustered points (R's
`clustertend::hopkins` and `pyclustertend.hopkins` return 1 - H). FedTSDP clusters the clients only when
H > 0.65 on their flattened softmax outputs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def default_sample_size(m: int) -> int:
    """m̃ = max(2, ceil(m / 4)), capped at m: 5 for 20 clients (not in the paper, which only asks m̃ << m; our
    choice)."""
    return min(m, max(2, math.ceil(0.25 * m)))


def hopkins_from_samples(X: Tensor, sample_idx: Tensor, uniform: Tensor) -> float:
    """H = Σz / (Σz + Σv) for given draws: z_j = distance from uniform point j to its nearest point of X,
    v_j = distance from X[sample_idx[j]] to its nearest *other* point of X (Euclidean)."""
    z = torch.cdist(uniform, X).min(dim=1).values
    D = torch.cdist(X[sample_idx], X)
    D[torch.arange(len(sample_idx), device=X.device), sample_idx] = float("inf")
    v = D.min(dim=1).values
    total = z.sum() + v.sum()
    if total <= 0:  # every point coincides: no evidence of structure
        return 0.5
    return float(z.sum() / total)


def hopkins(X: Any, sample_size: int | None = None, generator: torch.Generator | int | None = None) -> float:
    """Hopkins statistic of the rows of X (m, d) (numpy or torch; extra dims are flattened per row).

    Draws `sample_size` (default `default_sample_size(m)`) distinct real points and as many points uniformly
    in the per-coordinate bounding box of X (our reading of section 3.2.2's "sampling space of I"), then applies
    `hopkins_from_samples`. `generator` is a torch.Generator or an int seed for reproducible draws (None uses
    torch's global RNG). Computed in float64 on CPU, in float32 on other devices.
    """
    X = torch.as_tensor(X)
    if X.dim() < 2:
        raise ValueError(f"expected (m, d) points, got shape {tuple(X.shape)}")
    X = X.reshape(X.shape[0], -1)
    X = X.double() if X.device.type == "cpu" else X.float()
    m = X.shape[0]
    if m < 2:
        raise ValueError(f"the Hopkins statistic needs at least 2 points, got {m}")
    k = default_sample_size(m) if sample_size is None else int(sample_size)
    if not 1 <= k <= m:
        raise ValueError(f"sample_size must lie in [1, {m}], got {sample_size}")
    if isinstance(generator, int):
        generator = torch.Generator().manual_seed(generator)
    gen_device = generator.device if generator is not None else torch.device("cpu")
    sample_idx = torch.randperm(m, generator=generator, device=gen_device)[:k].to(X.device)
    low, high = X.min(dim=0).values, X.max(dim=0).values
    u = torch.rand(k, X.shape[1], generator=generator, device=gen_device, dtype=X.dtype).to(X.device)
    return hopkins_from_samples(X, sample_idx, low + u * (high - low))
