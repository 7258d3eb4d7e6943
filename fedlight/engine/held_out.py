"""`HeldOutClients`: the engine's `Newcomers` (`fedlight.plugin.newcomers`), a `ClientPopulation` of the held-out
clients run through the federation's own module, trainers and seeds, at the round being evaluated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import Tensor

from fedlight.plugin.data import ClientSplit, FederatedData
from fedlight.plugin.population import ClientPopulation
from fedlight.training.local_work import LocalWork

if TYPE_CHECKING:
    from fedlight.engine.group_training import GroupTraining
    from fedlight.plugin.server import ServerContext
    from fedlight.training.sequential import ClientTrainer, Trained


class HeldOutClients:
    """`Newcomers` of a run: the held-out clients' data (`FederatedData.newcomers`) as a `ClientPopulation` with the
    federation's own module, trainer, group training and seeds (`ServerContext.model.sample_losses`, `client_seed`),
    so a newcomer is run exactly as a training client would be. The engine sets `round` before each evaluation; the
    `Newcomers` methods are the population's at that round."""

    def __init__(
        self, data: FederatedData, server: "ServerContext", trainer: "ClientTrainer", training: "GroupTraining"
    ) -> None:
        def train_group(round: int, clients: list[int], starts: Tensor, work: LocalWork) -> "Trained":
            # a view taken at each call, so it follows the training clients' trainer choice (a probe's fall-back)
            return training.on(data.train, server.random.client_seed).fit(round, clients, starts, work)

        self.population = ClientPopulation(
            data, server.model.sample_losses, trainer, server.random.client_seed, train_group
        )
        self.trainer = trainer
        self.count, self.train_sizes = self.population.count, self.population.train_sizes
        self.round = 0

    def split(self, name: str) -> ClientSplit:
        """`Newcomers.split`: every newcomer's samples of split `name`."""
        return self.population.split(name)

    def losses(self, models: Tensor, split: str = "train") -> Tensor:
        """`Newcomers.losses`: (K, count) mean loss of each of K flat models on each newcomer's split."""
        return self.population.losses(models, split)

    def sample_losses(self, models: Tensor) -> tuple[Tensor, Tensor]:
        """`Newcomers.sample_losses`: each flat model's loss on every training row, and each row's newcomer."""
        return self.population.sample_losses(models)

    def train(self, newcomer: int, start: Tensor, epochs: int | None = None, purpose: str = "newcomer") -> Tensor:
        """`Newcomers.train`: one newcomer's flat model after local training from `start`, at `round`."""
        return self.population.train(self.round, newcomer, start, epochs, purpose=purpose).params

    def train_many(
        self,
        newcomers: list[int],
        starts: Tensor,
        epochs: int | None = None,
        purpose: str = "newcomer",
        trainable: Tensor | None = None,
    ) -> Tensor:
        """`Newcomers.train_many`: `train` of each newcomer from its row of `starts`, as one group."""
        return self.population.train_many(
            self.round, newcomers, starts, epochs, trainable=trainable, purpose=purpose
        ).params

    def batches(
        self, newcomer: int, epochs: int | None = None, purpose: str = "newcomer"
    ) -> Iterator[tuple[int, int, Any]]:
        """`Newcomers.batches`: (epoch, step, batch) of one newcomer's training split, at `round`."""
        return self.population.batches(self.round, newcomer, epochs, purpose)
