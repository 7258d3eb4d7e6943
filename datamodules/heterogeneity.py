"""Heterogeneity level H (p-FClus: "Fair Federated Data Clustering through Personalization: Bridging the Gap
between Diverse Data Distributions", Definition 1 and section 5.1): every client holds samples of exactly H of the
K "distributions" (the labels: classes, or k-means cluster ids of a table), balanced or in unequal amounts.
The paper gives no procedure for its real data; these procedures are our choice.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from fedlight.datamodules.partition import PartitionScheme


class Heterogeneity(PartitionScheme):
    """H distributions per client.

    - "balanced": a random permutation p of the K distribution ids; client z holds p[(z H + j) mod K] for
      j < H, so every distribution is held by about Z H / K clients (exactly, when that is an integer), and
      each distribution's shuffled samples are cut into equal chunks (sizes differ by at most one) among its
      holders. Every sample is used.
    - "unequal": every client picks H distributions uniformly without replacement; client sizes are
      proportional to size_base + j size_step (j = 0..Z-1, assigned to the clients in random order, scaled so
      the sizes add up to the pool); a client's share of each of its distributions is drawn from
      Dirichlet(alpha) over its H picks, and samples are drawn without replacement, capped at what is left
      of that distribution. Samples no client draws are LEFT OUT (as when a distribution runs dry), so the
      clients together hold fewer samples than the pool.

    Args:
        heterogeneity: H, at most the number of distinct labels.
        sizes: "balanced" or "unequal".
        size_base, size_step: the linear size profile of "unequal" (our synthetic values, see
            SyntheticGaussians, by default).
        alpha: Dirichlet concentration of the per-client shares in "unequal".
    """

    def __init__(
        self,
        heterogeneity: int = 2,
        sizes: Literal["balanced", "unequal"] = "balanced",
        size_base: float = 50.0,
        size_step: float = 10.0,
        alpha: float = 0.5,
    ) -> None:
        if heterogeneity < 1:
            raise ValueError(f"heterogeneity must be at least 1, got {heterogeneity}")
        if sizes not in ("balanced", "unequal"):
            raise ValueError(f"sizes must be 'balanced' or 'unequal', got {sizes!r}")
        if size_base <= 0 or size_step < 0 or alpha <= 0:
            raise ValueError(f"need size_base > 0, size_step >= 0, alpha > 0; got {size_base}, {size_step}, {alpha}")
        self.heterogeneity, self.sizes = heterogeneity, sizes
        self.size_base, self.size_step, self.alpha = size_base, size_step, alpha
        self.held: list[np.ndarray] | None = None  # the distributions of each client, after `assign`

    def assign(
        self, labels: np.ndarray, num_clients: int, rng: np.random.Generator, owners: np.ndarray | None = None
    ) -> list[np.ndarray]:
        ids = np.unique(labels)
        h = self.heterogeneity
        if h > len(ids):
            raise ValueError(f"heterogeneity={h} exceeds the {len(ids)} distributions (labels) of the data")
        pools = {d: rng.permutation(np.flatnonzero(labels == d)) for d in ids}
        if self.sizes == "balanced":
            order = ids[rng.permutation(len(ids))]
            self.held = [order[(z * h + np.arange(h)) % len(ids)] for z in range(num_clients)]
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for d in ids:
                holders = [z for z in range(num_clients) if d in self.held[z]]
                for z, chunk in zip(holders, np.array_split(pools[d], len(holders))):
                    parts[z].append(chunk)
        else:
            self.held = [rng.choice(ids, size=h, replace=False) for _ in range(num_clients)]
            profile = self.size_base + self.size_step * np.arange(num_clients, dtype=float)
            target = np.floor(profile[rng.permutation(num_clients)] / profile.sum() * len(labels)).astype(int)
            left = {d: 0 for d in ids}  # position of the next unused sample of each distribution
            parts = [[] for _ in range(num_clients)]
            for z in range(num_clients):
                shares = rng.dirichlet(np.full(h, self.alpha))
                for d, want in zip(self.held[z], np.round(shares * target[z]).astype(int)):
                    take = min(want, len(pools[d]) - left[d])
                    parts[z].append(pools[d][left[d] : left[d] + take])
                    left[d] += take
        out = [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]
        empty = [z for z, p in enumerate(out) if len(p) == 0]
        if empty:
            raise ValueError(
                f"clients {empty[:5]} got no samples: use fewer clients, a smaller size_step or a larger alpha"
            )
        return out
