"""Local training: every client trains its own model on its own data; nothing is ever averaged."""
import torch

from fedlight.engine.algorithm import Algorithm
from fedlight.engine.round_updates import RoundUpdates


class Local(Algorithm):
    """Each client is its own cluster of one, so its model is simply its own trained model. All clients train
    every round."""

    holds_updates = True  # keeps every client's trained model
    own_aggregation = True  # nothing is averaged: a robust rule or DP noise has nothing to act on

    def setup(self, server) -> None:
        super().setup(server)
        self.models = server.initial_params.repeat(server.num_clients, 1)
        self.assignment = torch.arange(server.num_clients, device=server.device)

    def select_clients(self, round: int) -> list[int]:
        return list(range(self.server.num_clients))

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        updates = updates.all()
        self.models[updates.clients] = updates.params
