"""Byzantine-robust aggregation rules as pure functions on an (m, d) matrix of updates, one row a client.

Each rule is vectorized over the coordinates (a sort, a pairwise-distance matrix, a few matrix-vector products), so
it runs as well on a GPU as on a CPU. The engine applies them within each cluster to the members' updates (trained
minus start, `fedlight.aggregators.cluster_aggregator`); every rule here but `clipped_mean` commutes with a shift of all
rows, so applying it to updates or to models gives the same cluster model.

Weights: the mean, `clipped_mean` and `geometric_median` use the clients' weights (as FedAvg and RFA do); the
median, trimmed mean, Krum, Multi-Krum and Bulyan count every client once, as their papers define them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedlight.aggregators.config import RULES
from fedlight.plugin.choices import unknown_choice


def weighted_mean(x: Tensor, weights: Tensor) -> Tensor:
    """sum_i w_i x_i / sum_i w_i."""
    w = weights.to(x.dtype)
    return (w @ x) / w.sum()


def coordinate_median(x: Tensor) -> Tensor:
    """The coordinate-wise median (the mean of the two middle values when m is even): "Byzantine-Robust Distributed
    Learning: Towards Optimal Statistical Rates" (Yin et al., ICML 2018), section 3."""
    ordered = x.sort(dim=0).values
    m = len(x)
    return (ordered[(m - 1) // 2] + ordered[m // 2]) / 2


def trimmed_mean(x: Tensor, beta: float) -> Tensor:
    """The coordinate-wise beta-trimmed mean: in each coordinate the floor(beta m) largest and smallest values are
    dropped and the rest averaged (Yin et al., ICML 2018, section 3)."""
    m = len(x)
    cut = int(math.floor(beta * m))
    return x.sort(dim=0).values[cut : m - cut].mean(dim=0)


def squared_distances(x: Tensor) -> Tensor:
    """(m, m) squared Euclidean distances of the rows, in float64 (from the Gram matrix, clamped at 0)."""
    x64 = x.double()
    norms = (x64 * x64).sum(dim=1)
    return (norms[:, None] + norms[None, :] - 2 * x64 @ x64.T).clamp(min=0).fill_diagonal_(0)


def krum_scores(x: Tensor, f: int, distances: Tensor | None = None) -> Tensor:
    """Each row's Krum score: the sum of squared distances to its m - f - 2 nearest other rows ("Machine Learning
    with Adversaries: Byzantine Tolerant Gradient Descent", Blanchard et al., NeurIPS 2017, section 4); at least one
    neighbour when the set is smaller than Krum's bound (Bulyan's last selections). `distances`: the rows' squared
    distances when already computed."""
    m = len(x)
    if m == 1:
        return x.new_zeros(1, dtype=torch.float64)
    neighbours = min(m - 1, max(1, m - f - 2))
    distances = (squared_distances(x) if distances is None else distances.clone()).fill_diagonal_(math.inf)
    return distances.topk(neighbours, dim=1, largest=False).values.sum(dim=1)


def krum(x: Tensor, f: int) -> Tensor:
    """The row with the lowest Krum score (ties: the first)."""
    return x[int(krum_scores(x, f).argmin())]


def multikrum(x: Tensor, f: int, keep: int | None = None) -> Tensor:
    """The mean of the `keep` rows with the lowest Krum scores (default m - f), Multi-Krum (Blanchard et al.,
    section 4)."""
    keep = len(x) - f if keep is None else keep
    chosen = krum_scores(x, f).argsort(stable=True)[: max(1, keep)]
    return x[chosen].mean(dim=0)


def bulyan(x: Tensor, f: int) -> Tensor:
    """Bulyan ("The Hidden Vulnerability of Distributed Learning in Byzantium", El Mhamdi et al., ICML 2018,
    section 4): theta = m - 2f rows chosen by Krum one at a time (each removed from the candidates), then in
    each coordinate the mean of the beta = theta - 2f chosen values closest to their median."""
    m = len(x)
    distances = squared_distances(x)  # once: each selection scores a submatrix of it
    remaining = list(range(m))
    chosen = []
    for _ in range(m - 2 * f):
        rows = torch.tensor(remaining, device=x.device)
        best = int(krum_scores(x[rows], f, distances[rows][:, rows]).argmin())
        chosen.append(remaining.pop(best))
    selected = x[chosen]
    beta = len(chosen) - 2 * f
    median = coordinate_median(selected)
    closest = (selected - median).abs().argsort(dim=0, stable=True)[:beta]
    return selected.gather(0, closest).mean(dim=0)


def geometric_median(
    x: Tensor, weights: Tensor, iterations: int = 100, smoothing: float = 1e-6, tolerance: float = 1e-8
) -> Tensor:
    """The weighted geometric median argmin_v sum_i w_i ||v - x_i||, by the smoothed Weiszfeld iterations of RFA
    ("Robust Aggregation for Federated Learning", Pillutla et al., IEEE TSP 2022, Algorithm 2): v <- sum_i b_i x_i /
    sum_i b_i with b_i = w_i / max(smoothing, ||v - x_i||), from the weighted mean, until the objective changes by less
    than `tolerance` (relative) or after `iterations` steps. Computed in float64."""
    x64, w = x.double(), weights.double()
    median = (w @ x64) / w.sum()

    def objective(v: Tensor) -> Tensor:
        return (w * (x64 - v).norm(dim=1)).sum()

    value = objective(median)
    for _ in range(iterations):
        b = w / (x64 - median).norm(dim=1).clamp(min=smoothing)
        median = (b @ x64) / b.sum()
        new = objective(median)
        if float(value - new) <= tolerance * float(value):
            break
        value = new
    return median.to(x.dtype)


def clip_rows(x: Tensor, bound: float) -> Tensor:
    """Every row scaled down to Euclidean norm at most `bound` (rows already within it are unchanged)."""
    norms = x.double().norm(dim=1, keepdim=True)
    return x * (bound / norms.clamp(min=bound)).to(x.dtype)


def clipped_mean(x: Tensor, weights: Tensor, bound: float) -> Tensor:
    """The weighted mean of the rows clipped to norm `bound` (the clipping of "Learning Differentially Private
    Recurrent Language Models", McMahan et al., ICLR 2018, without the noise)."""
    return weighted_mean(clip_rows(x, bound), weights)


def bucket_means(x: Tensor, weights: Tensor, size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Bucketing (Karimireddy, He, Jaggi, ICLR 2022, Algorithm 1): the rows in a random order (`generator`), cut into
    buckets of `size` (the last one smaller when `size` does not divide m); each bucket's weighted mean and its total
    weight."""
    order = torch.randperm(len(x), generator=generator).to(x.device)
    groups = order.split(size)
    means = torch.stack([weighted_mean(x[g], weights[g]) for g in groups])
    return means, torch.stack([weights[g].sum() for g in groups])


def apply_rule(
    name: str, x: Tensor, weights: Tensor, f: int = 0, beta: float = 0.1, clip: float = 1.0, keep: int | None = None
) -> Tensor:
    """Rule `name` on the rows of `x`. Krum, Multi-Krum and Bulyan lower f, in a cluster too small for it, to the
    largest the cluster admits (a cluster formed by a clustered method may be smaller than the configured bound)."""
    if name == "mean":
        return weighted_mean(x, weights)
    if name == "median":
        return coordinate_median(x)
    if name == "trimmed_mean":
        return trimmed_mean(x, beta)
    if name in ("krum", "multikrum"):
        f = min(f, max(0, (len(x) - 3) // 2))
        return krum(x, f) if name == "krum" else multikrum(x, f, None if keep is None else min(keep, len(x)))
    if name == "bulyan":
        return bulyan(x, min(f, max(0, (len(x) - 3) // 4)))
    if name == "geomed":
        return geometric_median(x, weights)
    if name == "clipped_mean":
        return clipped_mean(x, weights, clip)
    raise unknown_choice("aggregator.rule", name, RULES)
