"""CentClus: the centralized reference of p-FClus ("Fair Federated Data Clustering through Personalization: Bridging
the Gap between Diverse Data Distributions", section 5, baselines). Not federated: the
server pools every client's training points and runs the model's (k, l)-clustering (k-means for l = 2,
k-medoids for l = 1) on them; every client is then evaluated with those k centers. Clients do no work.

For k-medoids on very large pools, `max_points` switches to CLARA (not in the paper; our choice): `samples`
random subsets of `max_points` points are clustered and the medoid set with the lowest cost on all points is
kept.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedlight.cluster import kcenters
from fedlight.algorithms.centroid_base import CentroidAlgorithm
from fedlight.plugin import RoundUpdates


class CentClus(CentroidAlgorithm):
    """Centralized (k, l)-clustering of the pooled data. One round (`federation.rounds: 1`).

    Args:
        max_points: cluster random subsets of this many points when the pool is larger (CLARA); None: all.
        samples: number of subsets with `max_points`.
        n_init, max_iter, tol: the solver settings.
    """

    def __init__(
        self, max_points: int | None = None, samples: int = 5, n_init: int = 10, max_iter: int = 300, tol: float = 1e-4
    ) -> None:
        super().__init__(n_init, max_iter, tol)
        if max_points is not None and max_points < 1 or samples < 1:
            raise ValueError(f"max_points must be positive (or None) and samples >= 1, got {max_points}, {samples}")
        self.max_points, self.samples = max_points, samples

    def local_fit(self, round: int, client: int, x: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
        return start, torch.zeros((), device=start.device)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        x = self.all_points(self.server.clients.split("train").x)
        generator = self.server_generator(round)
        if self.max_points is None or len(x) <= self.max_points:
            centers = self.cluster(x, generator).centers
        else:
            best, centers = float("inf"), None
            for s in range(self.samples):
                rows = torch.randperm(len(x), generator=generator)[: self.max_points].to(x.device)
                candidate = self.cluster(x[rows], generator).centers
                total = float(kcenters.cost(x, candidate, self.ell))
                if total < best:
                    best, centers = total, candidate
        assert centers is not None  # at least one sample (samples >= 1) with a finite cost
        self.models = self.to_flat(centers).unsqueeze(0)
