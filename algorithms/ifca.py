"""IFCA (Ghosh et al., 2020): k cluster models; each client trains the one with the lowest loss on its data."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fedlight.plugin import Algorithm, RoundUpdates
from fedlight.cluster.differences import Differences
from fedlight.cluster.similarity import cosine_distance_matrix


class IFCA(Algorithm):
    """Iterative federated clustering. Every client belongs to the cluster model with the lowest loss on its
    training data; a selected client trains that model, and each cluster model becomes the size-weighted mean of
    its members that trained (a model nobody trained is unchanged). Clients are reassigned once per round, after
    aggregation, so the cluster a client is logged with is the one whose model it is evaluated with and trains
    next.

    Args:
        num_clusters: k, known in advance.
        warmup_rounds: optional warm start: train one shared model (FedAvg) for this many rounds, then seed
            the k cluster models with the trained models of k clients chosen farthest apart (farthest-first
            traversal on the cosine distances of their last updates). 0 = the paper's independent random
            initializations.
        participation: share of clients per round.
    """

    holds_updates = True  # the warm-up seeds the clusters with chosen clients' models

    def __init__(self, num_clusters: int = 2, warmup_rounds: int = 0, participation: float = 1.0) -> None:
        super().__init__(participation)
        if num_clusters < 1 or warmup_rounds < 0:
            raise ValueError("IFCA needs num_clusters >= 1 and warmup_rounds >= 0")
        self.num_clusters, self.warmup_rounds = num_clusters, warmup_rounds
        self.seeded = False  # whether the k cluster models exist (after the warm-up)

    def setup(self, server) -> None:
        super().setup(server)
        if not self.warmup_rounds:
            seeds = server.rng(0, "cluster-inits").integers(2**31, size=self.num_clusters)
            inits = [server.initial_params] + [server.random_params(int(seed)) for seed in seeds[1:]]
            self.models = torch.stack(inits)
            self.seeded = True
            self.assign_by_loss()

    def assign_by_loss(self) -> None:
        """Every client joins the cluster model with the lowest loss on its training data."""
        self.assignment = self.server.client_losses(self.models, "train").argmin(dim=0)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        super().aggregate(round, updates)
        if round == self.warmup_rounds and self.warmup_rounds:
            trained = updates.all()
            self.models = trained.params[self.farthest_first(trained.delta_rows())].clone()
            self.seeded = True

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        if self.seeded:
            self.assign_by_loss()

    def farthest_first(self, deltas: torch.Tensor | Differences) -> list[int]:
        """k row indices: start from the update farthest from the rest on average, then repeatedly the one
        farthest from those chosen (`Differences`: the updates read a block at a time, never held whole)."""
        distance = cosine_distance_matrix(deltas)
        chosen = [int(distance.mean(dim=1).argmax())]
        while len(chosen) < min(self.num_clusters, len(deltas)):
            chosen.append(int(distance[:, chosen].min(dim=1).values.argmax()))
        return chosen

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy() if self.seeded else None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seeded": self.seeded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.seeded = state["seeded"]
