"""Stand-ins for the clients that arrive after training (`fedlight.plugin.newcomers.Newcomers`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class CountedNewcomers:
    """Newcomers as a method that gives them all the same model reads them: their count."""

    def __init__(self, count: int) -> None:
        self.count = count


class FederationNewcomers:
    """The training clients of another federation (same partition, another seed: other samples), seen as clients
    that arrive after training: the `Newcomers` protocol from that federation's own services."""

    def __init__(self, fed, round: int = 1) -> None:
        self.server = fed.server
        self.count, self.round, self.train_sizes = fed.server.num_clients, round, fed.server.clients.train_sizes

    def split(self, name):
        return self.server.clients.split(name)

    def losses(self, models, split="train"):
        return self.server.clients.losses(models, split)

    def sample_losses(self, models):
        data = self.server.clients.split("train")
        losses = torch.stack(
            [F.cross_entropy(self.server.model.predict(m, data.x), data.y, reduction="none") for m in models]
        )
        return losses, self.server.clients.client_of_row("train")

    def train(self, newcomer, start, epochs=None, purpose="newcomer"):
        return self.server.clients.train(self.round, newcomer, start, epochs, purpose=purpose).params

    def train_many(self, newcomers, starts, epochs=None, purpose="newcomer"):
        return self.server.clients.train_many(self.round, newcomers, starts, epochs, purpose=purpose).params

    def batches(self, newcomer, epochs=None, purpose="newcomer"):
        return self.server.clients.batches(self.round, newcomer, epochs, purpose)
