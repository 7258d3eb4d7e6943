"""MFC (Makkar et al., ECAI 2023), multi-shot federated k-means, as the released code of p-FClus ("Fair Federated
Data Clustering through Personalization: Bridging the Gap between Diverse Data Distributions", section 5, baselines)
runs it.

Round 1 (shot 0): every client uploads its Awasthi-Sheffet local centers (as k-FED); the server starts from the
first uploaded center, grows to k by farthest-first and runs Lloyd on the uploaded centers: C_g.
Rounds 2.. (one shot each, so `federation.rounds` = 1 + shots; the reference code makes 10 shots): every client
assigns its points to the nearest center of C_g, recomputes the mean m_j of every non-empty cluster and scores
it, cost_j = mean over the cluster's points of (distance to the nearest recomputed mean)^2 (`score: repo`, the
p-FClus repository's), or the cost drop mean ||x - c_j||^2 - that (`score: cost_drop`); it uploads the mean and
size (m_j*, n_j*) of its highest-scoring cluster. The server runs weighted k-means (k-means++, `n_init`
restarts) on the uploaded means (weights n) together with the current centers (weight: the largest uploaded
n each): the new C_g. Every client is evaluated with C_g. k-means only (l = 2).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from fedlight.cluster import kcenters
from fedlight.algorithms.centroid_base import CentroidAlgorithm
from fedlight.plugin import PER_CLIENT, RoundUpdates

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class MFC(CentroidAlgorithm):
    """MFC. `federation.rounds` = 1 + number of shots (11 for the reference code's 10 shots).

    Args:
        score: how a client picks the cluster it shares: "repo" (the p-FClus repository's score) or
            "cost_drop" (the MFC authors' script).
        n_init, max_iter, tol: k-means settings (the server's weighted k-means uses n_init restarts).
    """

    one_shot = False

    def __init__(
        self, score: Literal["repo", "cost_drop"] = "repo", n_init: int = 10, max_iter: int = 300, tol: float = 1e-4
    ) -> None:
        super().__init__(n_init, max_iter, tol)
        if score not in ("repo", "cost_drop"):
            raise ValueError(f"score must be 'repo' or 'cost_drop', got {score!r}")
        self.score = score

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        if self.ell != 2 or self.medoids:
            raise ValueError("MFC is a k-means method: use a CentroidModel with ell: 2 and medoids: false")
        self.shared = server.state.declare(
            "shared", initial=torch.zeros(self.centroid_module.dim + 1)
        )  # last (mean, size)
        server.message.sends("shared", PER_CLIENT)  # kept per client, and read by the server client by client

    # -- clients -------------------------------------------------------------------------------------
    def local_fit(
        self, round: int, client: int, x: Tensor, start: Tensor
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, dict[str, Tensor]]:
        if round == 1:
            fit = kcenters.awasthi_sheffet(
                x, self.k, self.generator(self.server.random.client_seed(round, client)), self.max_iter, self.tol
            )
            return self.fitted(fit, x)
        centers = self.centers(start)
        dist, labels = kcenters.nearest(x, centers)
        member = torch.nn.functional.one_hot(labels, self.k).to(x.dtype)  # (n, k)
        sizes = member.sum(dim=0)
        present = sizes > 0
        means = (member.T @ x) / sizes.clamp(min=1)[:, None]
        to_means = kcenters.nearest(x, means[present])[0] ** 2
        score = (member * to_means[:, None]).sum(dim=0) / sizes.clamp(min=1)
        if self.score == "cost_drop":
            score = (member * (dist**2)[:, None]).sum(dim=0) / sizes.clamp(min=1) - score
        score = torch.where(present, score, torch.full_like(score, -torch.inf))
        best = int(score.argmax())
        shared = torch.cat([means[best], sizes[best : best + 1]]).to(self.shared.dtype)
        recentered = torch.where(present[:, None], means, centers)  # one local Lloyd step
        return recentered.reshape(-1), score[best].detach(), {"shared": shared}

    # -- server --------------------------------------------------------------------------------------
    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        held = updates.all()
        if round == 1:
            pooled = torch.cat(self.uploads(held))
            start = kcenters.farthest_first(pooled, pooled[:1], self.k)
            fit = kcenters.lloyd(pooled, start, max_iter=self.max_iter, tol=self.tol)
        else:
            current = self.centers(self.models[0])
            shared = held.state["shared"]  # stored by the engine after the round
            means, sizes = shared[:, :-1], shared[:, -1]
            points = torch.cat([means, current])
            weights = torch.cat([sizes, sizes.max().expand(len(current))])
            fit = self.cluster(points, self.server_generator(round), weights)
        self.models = self.to_flat(fit.centers).unsqueeze(0)
