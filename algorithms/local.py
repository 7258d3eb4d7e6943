"""Local training: every client trains its own model on its own data; nothing is ever averaged."""
import torch

from fedlight.algorithm import Algorithm, Updates


class Local(Algorithm):
    """Each client is its own cluster of one, so the inherited per-cluster average of a single update is that
    client's own model. All clients train every round."""

    def setup(self, fed) -> None:
        super().setup(fed)
        self.models = fed.initial_params.repeat(fed.num_clients, 1)
        self.assignment = torch.arange(fed.num_clients, device=fed.device)

    def select_clients(self, round: int) -> list[int]:
        return list(range(self.fed.num_clients))

    def aggregate(self, round: int, updates: Updates) -> None:
        self.models[updates.clients] = updates.params
