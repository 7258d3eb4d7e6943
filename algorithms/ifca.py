"""IFCA (Ghosh et al., 2020): k cluster models; each client trains the one with the lowest loss on its data."""
from __future__ import annotations

import numpy as np
import torch

from fedlight.algorithm import Algorithm
from fedlight.similarity import cosine_distance_matrix


class IFCA(Algorithm):
    """Iterative federated clustering. Every round each selected client evaluates all k cluster models on its
    training data, joins the one with the lowest loss and trains it; each cluster model becomes the
    size-weighted mean of the clients that chose it (a model nobody chose is unchanged). At evaluation every
    client picks its model by the same rule.

    Args:
        num_clusters: k, known in advance.
        warmup_rounds: optional warm start: train one shared model (FedAvg) for this many rounds, then seed
            the k cluster models with the trained models of k clients chosen farthest apart (farthest-first
            traversal on the cosine distances of their last updates). 0 = the paper's independent random
            initializations.
        participation: share of clients per round.
    """

    def __init__(self, num_clusters: int = 2, warmup_rounds: int = 0, participation: float = 1.0) -> None:
        super().__init__(participation)
        if num_clusters < 1 or warmup_rounds < 0:
            raise ValueError("IFCA needs num_clusters >= 1 and warmup_rounds >= 0")
        self.num_clusters, self.warmup_rounds = num_clusters, warmup_rounds

    def setup(self, fed) -> None:
        super().setup(fed)
        if not self.warmup_rounds:
            seeds = fed.rng(0, "cluster-inits").integers(2**31, size=self.num_clusters)
            inits = [fed.initial_params] + [fed.random_params(int(seed)) for seed in seeds[1:]]
            self.models = torch.stack(inits)

    def warming_up(self, round: int) -> bool:
        return round <= self.warmup_rounds

    def select_clients(self, round: int) -> list[int]:
        clients = super().select_clients(round)
        if not self.warming_up(round):
            self.assign_by_loss(clients)
        return clients

    def assign_by_loss(self, clients: list[int] | None = None) -> None:
        """Each client (all by default) joins the cluster model with the lowest loss on its training data."""
        best = self.fed.client_losses(self.models, "train").argmin(dim=0)
        if clients is None:
            self.assignment = best
        else:
            self.assignment[clients] = best[clients]

    def aggregate(self, round: int, updates) -> None:
        super().aggregate(round, updates)
        if round == self.warmup_rounds and self.warmup_rounds:
            self.models = updates.params[self.farthest_first(updates.deltas)].clone()

    def farthest_first(self, deltas: torch.Tensor) -> list[int]:
        """k row indices: start from the update farthest from the rest on average, then repeatedly the one
        farthest from those chosen."""
        distance = cosine_distance_matrix(deltas)
        chosen = [int(distance.mean(dim=1).argmax())]
        while len(chosen) < min(self.num_clusters, len(deltas)):
            chosen.append(int(distance[:, chosen].min(dim=1).values.argmax()))
        return chosen

    def evaluation_models(self):
        if self.fed.round > self.warmup_rounds:
            self.assign_by_loss()
        return super().evaluation_models()

    def cluster_labels(self) -> np.ndarray | None:
        return None if self.fed.round <= self.warmup_rounds else self.assignment.cpu().numpy()
