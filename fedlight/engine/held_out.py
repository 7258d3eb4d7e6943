"""`HeldOutClients`: the engine's `Newcomers` (`fedlight.plugin.newcomers`), the held-out clients' data run through
the federation's own module, trainers and seeds."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlight.plugin.data import SPLITS, ClientSplit, FederatedData
from fedlight.plugin.server import split_losses
from fedlight.training.local_work import LocalWork

if TYPE_CHECKING:
    from fedlight.engine.group_training import GroupTraining
    from fedlight.plugin.server import ServerContext
    from fedlight.training.sequential import ClientTrainer


class HeldOutClients:
    """`Newcomers` of a run: the held-out clients' data (`FederatedData.newcomers`) run through the federation's
    own module, trainer and seeds (`ServerContext.predict`, `client_seed`), so a newcomer is run exactly as a
    training client would be. The engine sets `round` before each evaluation."""

    def __init__(self, data: FederatedData, server: "ServerContext", trainer: "ClientTrainer",
                 training: "GroupTraining | None" = None) -> None:
        self.data, self.server, self.trainer = data, server, trainer
        self.training = training  # the training clients' group training, run on the newcomers' data
        self.count = data.num_clients
        self.round = 0
        self.train_sizes = torch.as_tensor(data.train.sizes(), device=server.device)
        self.rows = {name: data.split(name).client_of_row() for name in SPLITS}

    def split(self, name: str) -> ClientSplit:
        return self.data.split(name)

    def losses(self, models: Tensor, split: str = "train") -> Tensor:
        return split_losses(self.server.predict, models, self.split(split), self.rows[split])

    @torch.no_grad()
    def sample_losses(self, models: Tensor) -> tuple[Tensor, Tensor]:
        data = self.data.train
        losses = torch.stack([F.cross_entropy(self.server.predict(params, data.x), data.y, reduction="none")
                              for params in models]) if len(models) else torch.zeros(0, len(data.y))
        return losses, self.rows["train"]

    def seed(self, newcomer: int, purpose: str) -> int:
        """The seed of a newcomer's local work at this evaluation: (seed, round, newcomer, purpose)."""
        return self.server.client_seed(self.round, newcomer, purpose)

    def train(self, newcomer: int, start: Tensor, epochs: int | None = None, purpose: str = "newcomer") -> Tensor:
        x, y = self.data.train.client(newcomer)
        return self.trainer.fit(start, x, y, self.seed(newcomer, purpose), epochs=epochs,
                                round=max(self.round, 1)).params

    def train_many(self, newcomers: list[int], starts: Tensor, epochs: int | None = None,
                   purpose: str = "newcomer") -> Tensor:
        if self.training is None:
            return torch.stack([self.train(j, s, epochs, purpose) for j, s in zip(newcomers, starts)])
        view = self.training.on(self.data.train, lambda round, j, p: self.seed(j, p))
        return view.fit(self.round, list(newcomers), starts, LocalWork(epochs, purpose=purpose)).params

    def batches(self, newcomer: int, epochs: int | None = None,
                purpose: str = "newcomer") -> Iterator[tuple[int, int, Any]]:
        x, y = self.data.train.client(newcomer)
        return self.trainer.batches(x, y, self.seed(newcomer, purpose), epochs)
