"""k-FED (Dennis, Li and Smith, ICML 2021), one-shot federated k-means, as the released code of p-FClus ("Fair
Federated Data Clustering through Personalization: Bridging the Gap between Diverse Data Distributions", section 5,
baselines) runs it.

Clients: the Awasthi-Sheffet local k-means with k' centers (k' = k in the reference code) (project on the top-k right
singular vectors, seed with k-means++ there, keep each seed's "3x closer" points, lift their mean back, Lloyd to
convergence). Server ("cleanup"): start from the first client's centers (or a random client's), grow to k by
farthest-first over all uploaded centers, then Lloyd on the uploaded centers to convergence (`server_steps: 1` is the
original paper's single step). Every client is evaluated with the same k global centers. k-means only (l = 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from fedlight.cluster import kcenters
from fedlight.algorithms.centroid_base import CentroidAlgorithm
from fedlight.plugin import RoundUpdates

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class KFED(CentroidAlgorithm):
    """k-FED. One round (`federation.rounds: 1`).

    Args:
        local_k: centers per client, k' (None: k, as the reference code; the k-FED paper sets it to the number
            of distributions a client holds, at most k).
        server_steps: Lloyd iterations on the server (None: to convergence, as the reference code; 1: the
            original k-FED's single step).
        start_client: whose centers start the server: "first" (client 0, the reference code) or "random".
        max_iter, tol: Lloyd settings of the clients and the server.
    """

    def __init__(
        self,
        local_k: int | None = None,
        server_steps: int | None = None,
        start_client: Literal["first", "random"] = "first",
        max_iter: int = 300,
        tol: float = 1e-4,
    ) -> None:
        super().__init__(n_init=1, max_iter=max_iter, tol=tol)
        if local_k is not None and local_k < 1:
            raise ValueError(f"local_k must be at least 1 (or None for k), got {local_k}")
        if server_steps is not None and server_steps < 1:
            raise ValueError(f"server_steps must be at least 1 (or None for convergence), got {server_steps}")
        if start_client not in ("first", "random"):
            raise ValueError(f"start_client must be 'first' or 'random', got {start_client!r}")
        self.local_k, self.server_steps, self.start_client = local_k, server_steps, start_client

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        if self.ell != 2 or self.medoids:
            raise ValueError(
                f"{type(self).__name__} is a k-means method: use a CentroidModel with ell: 2 and medoids: false"
            )
        if self.local_k is not None and self.local_k > self.k:
            raise ValueError(f"local_k={self.local_k} exceeds the model's {self.k} centers")

    def local_fit(
        self, round: int, client: int, x: Tensor, start: Tensor
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, dict[str, Tensor]]:
        fit = kcenters.awasthi_sheffet(
            x,
            self.local_k or self.k,
            self.generator(self.server.random.client_seed(round, client)),
            self.max_iter,
            self.tol,
        )
        return self.fitted(fit, x)

    def start_centers(self, round: int, uploads: list[Tensor]) -> Tensor:
        """The uploaded centers that start the server's farthest-first: the first client's, or a random client's drawn
        from the (round, "start") stream (`start_client`)."""
        first = (
            0 if self.start_client == "first" else int(self.server.random.rng(round, "start").integers(len(uploads)))
        )
        return uploads[first]

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        held = updates.all()
        uploads = self.uploads(held)
        pooled = torch.cat(uploads)
        start = kcenters.farthest_first(pooled, self.start_centers(round, uploads), self.k)
        fit = kcenters.lloyd(pooled, start, max_iter=self.server_steps or self.max_iter, tol=self.tol)
        self.models = self.to_flat(fit.centers).unsqueeze(0)
