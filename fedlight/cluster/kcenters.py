"""(k, l)-clustering in torch, on the data's device: k-means (l = 2), k-medoids (centers are data points, any l,
L1 for l = 1) and Lloyd for any finite l >= 1 (each center coordinate is a 1-D convex fit).

The objective of a center set C on points x with weights w is sum_i w_i d_l(x_i, C)^l, where d_l is the l-norm
distance to the nearest center; its l-th power is the coordinate-separable sum_j |x_j - c_j|^l. Every solver
runs `n_init` restarts at once as a batch (rows of an (R, k, h) tensor) and keeps the one with the lowest
cost, so one call is a handful of batched tensor operations per iteration, not a Python loop over restarts.

All randomness comes from the `torch.Generator` passed in (k-means++ draws), so a call is a pure function of
(data, generator state): clients seeded by (run seed, round, client) repeat exactly after a resume.

Conventions follow scikit-learn's KMeans where it has one: greedy k-means++ seeding with 2 + log(k) local
trials, `tol` relative to the mean per-feature variance of the data, stop on unchanged labels or a small
center shift, empty clusters moved to the points farthest from their centers, final labels recomputed from the
final centers.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

#: CPU problems with at most this many numbers (points x features) run on one thread: their tensors are far
#: too small to gain from intra-op threads, which only add synchronization (and stall badly on a busy machine)
SMALL_PROBLEM = 1 << 16
#: point sets up to this size keep their full n x n distance matrix during k-medoids (else one cluster at a time)
MEDOID_MATRIX_MAX = 4096


@dataclass
class CenterFit:
    """A fitted center set. `cost` is the weighted objective sum_i w_i d(x_i, C)^l (the inertia for l = 2)."""

    centers: Tensor  # (k, h); fewer rows than asked when there were fewer points than k
    labels: Tensor  # (n,) index of each point's nearest center
    cost: float
    n_iter: int
    medoids: Tensor | None = None  # (k,) row indices into x of the centers, for k-medoids


@contextmanager
def small_problem_threads(size: int, device: torch.device | str) -> Iterator[None]:
    """Run the block on one CPU thread when `size` numbers are at most SMALL_PROBLEM (restored afterwards)."""
    threads = torch.get_num_threads()
    if torch.device(device).type != "cpu" or size > SMALL_PROBLEM or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# -- distances ---------------------------------------------------------------------------------------
def distances(x: Tensor, centers: Tensor, ell: float = 2.0) -> Tensor:
    """l-norm distances between the rows of `x` (..., n, h) and `centers` (..., k, h): (..., n, k).

    For l = 2 with few features the differences are computed directly (exact); with many features the
    matrix-product form is used (faster, slightly less exact)."""
    mode = "use_mm_for_euclid_dist_if_necessary" if x.shape[-1] > 64 else "donot_use_mm_for_euclid_dist"
    return torch.cdist(x, centers.to(x.dtype), p=float(ell), compute_mode=mode)


def power(d: Tensor, ell: float) -> Tensor:
    """d ** l, exact for l = 1 and l = 2."""
    if ell == 1:
        return d
    if ell == 2:
        return d * d
    return d.pow(ell)


def nearest(x: Tensor, centers: Tensor, ell: float = 2.0) -> tuple[Tensor, Tensor]:
    """(distance to the nearest center, its index) of every row of `x`; ties go to the lowest index."""
    d = distances(x, centers, ell)
    dmin, labels = d.min(dim=-1)
    return dmin, labels


def cost(x: Tensor, centers: Tensor, ell: float = 2.0, p: float | None = None, weights: Tensor | None = None) -> Tensor:
    """sum_i w_i d_l(x_i, C)^p (p defaults to l): the (k, l)-clustering cost, or with p = 1 the sum of
    unsquared distances."""
    dmin, _ = nearest(x, centers, ell)
    terms = power(dmin, ell if p is None else p)
    return terms.sum() if weights is None else (terms * weights).sum()


# -- seeding -----------------------------------------------------------------------------------------
def _weights(x: Tensor, weights: Tensor | None) -> Tensor:
    if weights is None:
        return torch.ones(len(x), dtype=x.dtype, device=x.device)
    w = torch.as_tensor(weights, dtype=x.dtype, device=x.device)
    if w.shape != (len(x),) or bool((w < 0).any()):
        raise ValueError(f"weights must be {len(x)} non-negative numbers, got shape {tuple(w.shape)}")
    return w


def _draw(probs: Tensor, count: int, generator: torch.Generator | None) -> Tensor:
    """`count` draws with replacement per row of non-negative `probs` (rows summing to zero draw uniformly), made
    on the generator's device (the CPU for `generator_for`'s), so a seed picks the same rows on every device."""
    total = probs.sum(dim=-1, keepdim=True)
    probs = torch.where(total > 0, probs, torch.ones_like(probs))
    on = probs.device if generator is None else generator.device
    return torch.multinomial(probs.to(on), count, replacement=True, generator=generator).to(probs.device)


def kmeans_plusplus(
    x: Tensor,
    k: int,
    ell: float = 2.0,
    weights: Tensor | None = None,
    runs: int = 1,
    generator: torch.Generator | None = None,
    n_local_trials: int | None = None,
) -> Tensor:
    """Greedy k-means++ seeding (scikit-learn's), `runs` independent seedings at once: (runs, k) row indices.

    The first center is drawn with probability proportional to the weights; each next one among
    `n_local_trials` (default 2 + log k) candidates drawn with probability proportional to w * d^l, keeping
    the candidate that lowers the potential sum w * min d^l the most. l = 2 is k-means++, l = 1 k-medoids++.
    """
    n = len(x)
    if not 1 <= k <= n:
        raise ValueError(f"k-means++ needs 1 <= k <= {n} (the number of points), got k={k}")
    w = _weights(x, weights)
    trials = n_local_trials or 2 + int(math.log(k))
    chosen = torch.empty(runs, k, dtype=torch.long, device=x.device)
    chosen[:, 0] = _draw(w.expand(runs, n), 1, generator)[:, 0]
    closest = power(distances(x[chosen[:, 0]].unsqueeze(1), x), ell).squeeze(1)  # (R, n)
    rows = torch.arange(runs, device=x.device)
    for c in range(1, k):
        candidates = _draw(closest * w, trials, generator)  # (R, t)
        to_candidates = power(distances(x[candidates], x), ell)  # (R, t, n)
        merged = torch.minimum(closest.unsqueeze(1), to_candidates)
        best = (merged * w).sum(dim=-1).argmin(dim=1)  # (R,)
        chosen[:, c] = candidates[rows, best]
        closest = merged[rows, best]
    return chosen


# -- solvers -----------------------------------------------------------------------------------------
def absolute_tolerance(x: Tensor, tol: float, weights: Tensor | None = None) -> float:
    """`tol` times the mean per-feature (weighted) variance of `x`, as scikit-learn scales its tolerance."""
    if tol == 0 or len(x) < 2:
        return 0.0
    w = _weights(x, weights)
    mean = (w[:, None] * x).sum(0) / w.sum()
    return float(tol * ((w[:, None] * (x - mean) ** 2).sum(0) / w.sum()).mean())


def ell_centers(x: Tensor, member: Tensor, ell: float, previous: Tensor, iters: int = 60) -> Tensor:
    """Per cluster and coordinate, argmin_c sum_i member_i |x_i - c|^l (a weighted median for l = 1, the
    weighted mean for l = 2), by bisection on the monotone derivative. member: (R, n, k) weights, previous
    (R, k, h) is kept for empty clusters."""
    if ell == 2:
        counts = member.sum(dim=1)
        means = torch.einsum("rnk,nh->rkh", member, x) / counts.clamp(min=torch.finfo(x.dtype).tiny)[..., None]
        return torch.where(counts[..., None] > 0, means, previous)
    out = previous.clone()
    lo0, hi0 = x.min(dim=0).values, x.max(dim=0).values
    for j in range(member.shape[2]):
        w = member[:, :, j]  # (R, n)
        lo = lo0.expand(len(w), -1).clone()
        hi = hi0.expand(len(w), -1).clone()
        for _ in range(iters):
            mid = (lo + hi) / 2
            diff = mid[:, None, :] - x[None]  # (R, n, h)
            slope = (w[..., None] * torch.sign(diff) * diff.abs().pow(ell - 1)).sum(dim=1)
            up = slope > 0
            hi = torch.where(up, mid, hi)
            lo = torch.where(up, lo, mid)
        has = w.sum(dim=1) > 0
        out[:, j] = torch.where(has[:, None], (lo + hi) / 2, previous[:, j])
    return out


def _relocate_empty(x: Tensor, centers: Tensor, counts: Tensor, dmin: Tensor) -> Tensor:
    """Move the centers of empty clusters to the points farthest from their own centers (distinct points)."""
    for r in torch.nonzero((counts == 0).any(dim=1)).flatten().tolist():
        empty = torch.nonzero(counts[r] == 0).flatten()
        far = torch.argsort(dmin[r], descending=True, stable=True)[: len(empty)]
        centers[r, empty[: len(far)]] = x[far]
    return centers


def _lloyd(
    x: Tensor,
    w: Tensor,
    centers: Tensor,
    ell: float,
    max_iter: int,
    tol_abs: float,
) -> tuple[Tensor, int]:
    """Batched Lloyd iterations from `centers` (R, k, h); returns the final centers and iterations run."""
    runs, k = centers.shape[:2]
    labels = None
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        d = distances(x.expand(runs, *x.shape), centers, ell)
        dmin, new_labels = d.min(dim=-1)
        member = F.one_hot(new_labels, k).to(x.dtype) * w[None, :, None]
        updated = ell_centers(x, member, ell, centers)
        counts = member.sum(dim=1)
        if bool((counts == 0).any()):
            updated = _relocate_empty(x, updated, counts, dmin)
        shift = ((updated - centers) ** 2).sum(dim=(1, 2))
        centers = updated
        if labels is not None and torch.equal(labels, new_labels):
            break
        labels = new_labels
        if bool((shift <= tol_abs).all()):
            break
    return centers, n_iter


def _medoid_matrix(x: Tensor, w: Tensor, start: Tensor, ell: float, max_iter: int) -> tuple[Tensor, int]:
    """Alternating k-medoids with the full n x n matrix of d^l: (R, k) medoid indices."""
    dpow = power(distances(x, x, ell), ell)  # (n, n)
    medoids, k, n_iter = start.clone(), start.shape[1], 0
    rows = torch.arange(len(x), device=x.device)
    for n_iter in range(1, max_iter + 1):
        labels = dpow[:, medoids].permute(1, 0, 2).argmin(dim=-1)  # (R, n)
        member = F.one_hot(labels, k).to(x.dtype) * w[None, :, None]  # (R, n, k)
        within = dpow @ member  # (R, n, k): cost of i as medoid of j
        within = within.masked_fill(F.one_hot(labels, k) == 0, torch.inf)
        best_cost, best = within.min(dim=1)  # (R, k)
        current_cost = within.gather(1, medoids.unsqueeze(1)).squeeze(1)
        keep = ~(best_cost < current_cost)  # ties and empty clusters keep theirs
        updated = torch.where(keep, medoids, rows[best])
        if torch.equal(updated, medoids):
            break
        medoids = updated
    return medoids, n_iter


def _medoid_loop(x: Tensor, w: Tensor, start: Tensor, ell: float, max_iter: int) -> tuple[Tensor, int]:
    """Alternating k-medoids one cluster at a time (memory: the largest cluster squared)."""
    medoids, n_iter = start.clone(), 0
    for r in range(len(medoids)):
        for n_iter in range(1, max_iter + 1):
            labels = distances(x, x[medoids[r]], ell).argmin(dim=1)
            updated = medoids[r].clone()
            for j in range(len(updated)):
                members = torch.nonzero(labels == j).flatten()
                if len(members) == 0:
                    continue
                pts = x[members]
                within = power(distances(pts, pts, ell), ell) @ w[members]
                current = (power(distances(x[updated[j]][None], pts, ell), ell)[0] * w[members]).sum()
                best = within.argmin()
                if within[best] < current:
                    updated[j] = members[best]
            if torch.equal(updated, medoids[r]):
                break
            medoids[r] = updated
    return medoids, n_iter


def fit(
    x: Tensor,
    k: int,
    ell: float = 2.0,
    medoids: bool = False,
    weights: Tensor | None = None,
    n_init: int = 10,
    max_iter: int = 300,
    tol: float = 1e-4,
    generator: torch.Generator | None = None,
    init: Tensor | None = None,
) -> CenterFit:
    """(k, l)-clustering of the rows of `x` (n, h): the best of `n_init` k-means++ restarts (or one run from
    `init`), each refined by Lloyd's algorithm (free centers) or alternating k-medoids (`medoids=True`:
    centers are rows of x). With no more positively weighted points than k, the centers are those points.

    Args:
        x: (n, h) floating points.
        k: number of centers (at most the number of points is returned).
        ell: the norm of the distance and the power of the objective (2: k-means, 1 with medoids: k-medoids).
        medoids: constrain the centers to data points.
        weights: (n,) non-negative point weights (default all 1).
        n_init: restarts, run as one batch; the lowest cost wins (ignored with `init`).
        max_iter: iterations per run.
        tol: stop when the squared center shift of every run is at most tol * mean feature variance.
        generator: the source of k-means++ draws.
        init: (k, h) starting centers instead of seeding (for medoids they are snapped to their nearest points).
    """
    with small_problem_threads(x.numel(), x.device):
        return _fit(x, k, ell, medoids, weights, n_init, max_iter, tol, generator, init)


def _fit(
    x: Tensor,
    k: int,
    ell: float,
    medoids: bool,
    weights: Tensor | None,
    n_init: int,
    max_iter: int,
    tol: float,
    generator: torch.Generator | None,
    init: Tensor | None,
) -> CenterFit:
    if ell < 1 or not math.isfinite(ell):
        raise ValueError(f"ell must be a finite number >= 1, got {ell}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"x must be a non-empty (n, h) matrix, got shape {tuple(x.shape)}")
    w = _weights(x, weights)
    support = torch.nonzero(w > 0).flatten()
    if len(support) <= k and init is None:
        centers = x[support]
        labels = nearest(x, centers, ell)[1]
        return CenterFit(
            centers.clone(), labels, float(cost(x, centers, ell, weights=w)), 0, support if medoids else None
        )
    if init is not None:
        start_centers = torch.as_tensor(init, dtype=x.dtype, device=x.device).unsqueeze(0)
        k = start_centers.shape[1]
        start_index = nearest(start_centers[0], x, ell)[1].unsqueeze(0) if medoids else None
    else:
        start_index = kmeans_plusplus(x, k, ell, w, runs=n_init, generator=generator)
        start_centers = x[start_index]
    if medoids:
        solve = _medoid_matrix if len(x) <= MEDOID_MATRIX_MAX else _medoid_loop
        assert start_index is not None  # medoids start from rows of x
        index, n_iter = solve(x, w, start_index, ell, max_iter)
        centers = x[index]
    else:
        centers, n_iter = _lloyd(x, w, start_centers, ell, max_iter, absolute_tolerance(x, tol, w))
        index = None
    dmin, labels = distances(x.expand(len(centers), *x.shape), centers, ell).min(dim=-1)
    costs = (power(dmin, ell) * w).sum(dim=1)
    best = int(costs.argmin())
    return CenterFit(
        centers[best].clone(), labels[best], float(costs[best]), n_iter, None if index is None else index[best]
    )


def lloyd(
    x: Tensor, init: Tensor, weights: Tensor | None = None, max_iter: int = 300, tol: float = 1e-4, ell: float = 2.0
) -> CenterFit:
    """Lloyd's algorithm from the given centers (one run, no seeding); `max_iter=1` is a single step."""
    return fit(x, len(init), ell, weights=weights, max_iter=max_iter, tol=tol, init=init)


def farthest_first(points: Tensor, start: Tensor, k: int) -> Tensor:
    """Grow `start` (m, h) to k centers by repeatedly adding the row of `points` farthest from the current
    set (max over points of the min distance); k-FED's and MFC's server initialization."""
    centers = start.clone()
    closest = nearest(points, centers)[0]
    while len(centers) < k:
        pick = int(closest.argmax())
        centers = torch.cat([centers, points[pick : pick + 1]])
        closest = torch.minimum(closest, distances(points, points[pick : pick + 1])[:, 0])
    return centers


def awasthi_sheffet(
    x: Tensor, k: int, generator: torch.Generator | None = None, max_iter: int = 300, tol: float = 1e-4
) -> CenterFit:
    """The Awasthi-Sheffet local k-means of k-FED (Dennis et al. 2021, as in the p-FClus baselines' code):
    project on the top-k right singular vectors (no centering), seed with k-means++ in the projection, move
    each seed to the mean of the points at least 3x closer to it than to any other seed, lift back, and run
    Lloyd on the original points from there. With at most k points the centers are the points.

    The projection uses an exact SVD where the reference code used a randomized one (same subspace up to its
    approximation error, and deterministic)."""
    with small_problem_threads(x.numel(), x.device):
        return _awasthi_sheffet(x, k, generator, max_iter, tol)


def _awasthi_sheffet(x: Tensor, k: int, generator: torch.Generator | None, max_iter: int, tol: float) -> CenterFit:
    if len(x) <= k:
        return fit(x, k)
    _, _, vh = torch.linalg.svd(x, full_matrices=False)
    v = vh[: min(k, vh.shape[0])].T  # (h, r)
    projected = x @ v
    seeds = projected[kmeans_plusplus(projected, k, generator=generator)[0]]  # (k, r)
    d = distances(projected, seeds)  # (n, k)
    others = d.unsqueeze(1).expand(-1, k, -1).clone()  # (n, r, s)
    others[:, torch.arange(k), torch.arange(k)] = torch.inf
    close = others.min(dim=2).values >= 3 * d  # (n, r): point i is in S_r
    member = close.to(x.dtype)
    theta = (member.T @ projected) / member.sum(dim=0)[:, None]
    return lloyd(x, theta @ v.T, max_iter=max_iter, tol=tol)


def pad_centers(centers: Tensor, k: int) -> Tensor:
    """(k, h) from fewer rows, by repeating the first row at the end (nearest-center results and costs are
    unchanged: a repeated row never wins a tie against its original)."""
    if len(centers) >= k:
        return centers[:k]
    return torch.cat([centers, centers[:1].expand(k - len(centers), -1)])


def generator_for(seed: int) -> torch.Generator:
    """A CPU torch generator seeded with `seed` (reduced to 63 bits): k-means++ draws from it whatever device the
    points are on, so a run clusters alike on a CPU and a GPU."""
    return torch.Generator().manual_seed(int(seed) % (2**63))
