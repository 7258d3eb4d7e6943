"""Clients that arrive after training: held out of every round (`data.init_args.holdout_clients`), then given a
model at each evaluation by `Algorithm.newcomer_models` and scored apart from the training clients (`unseen/*`).

`Newcomers` is what an algorithm sees of them: their data and ways to run a model on it, never their labels'
ground-truth clusters. The engine's implementation, `fedlight.engine.held_out.HeldOutClients`, is a
`ClientPopulation` (`fedlight.plugin.population`, the class of the training clients, `ServerContext.clients`) at the
round being evaluated. A newcomer's local work (training from a start, its batches) is seeded by (seed, round,
newcomer, purpose), so an evaluation repeats exactly in a resumed run.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from fedlight.plugin.data import ClientSplit


@runtime_checkable
class Newcomers(Protocol):
    """The held-out clients of a run, indexed 0..count-1 (their own numbering, not the training clients').

    Attributes:
        count: how many newcomers there are.
        round: the round whose evaluation asks for their models.
        train_sizes: (count,) their training-set sizes.
    """

    count: int
    round: int
    train_sizes: Tensor

    def split(self, name: str) -> ClientSplit:
        """Every newcomer's samples of split `name` ("train", "val" or "test"), raw (`ServerContext.data.inputs`
        converts them as the model sees them)."""
        ...

    def losses(self, models: Tensor, split: str = "train") -> Tensor:
        """(K, count) mean cross-entropy of each of K flat models on each newcomer's split (to pick a cluster model
        by loss, as IFCA does); NaN for a newcomer with no sample in the split."""
        ...

    def sample_losses(self, models: Tensor) -> tuple[Tensor, Tensor]:
        """((K, rows) cross-entropy of each flat model on every training row, (rows,) the newcomer of each row):
        what a mixture's E-step needs (FedEM)."""
        ...

    def train(self, newcomer: int, start: Tensor, epochs: int | None = None, purpose: str = "newcomer") -> Tensor:
        """The flat model after local training from `start` on one newcomer's training split with the module's
        `training_step` and optimizer (`epochs` defaults to the federation's local epochs): a newcomer's own update,
        for methods that cluster updates or weights (its update is the result minus `start`). Another `purpose`
        draws another stream of batches (fine-tuning)."""
        ...

    def train_many(
        self,
        newcomers: list[int],
        starts: Tensor,
        epochs: int | None = None,
        purpose: str = "newcomer",
        trainable: Tensor | None = None,
    ) -> Tensor:
        """(len(newcomers), d) `train` of each newcomer from its row of `starts`, as one group: vectorized when the
        run's plan trains its clients vectorized (`ServerContext.clients.train_many`). `trainable` ((d,) bool) freezes
        the other entries, which end exactly at their starts (FedRep fits a newcomer's head on the global body)."""
        ...

    def batches(
        self, newcomer: int, epochs: int | None = None, purpose: str = "newcomer"
    ) -> Iterator[tuple[int, int, Any]]:
        """(epoch, step, batch) of one newcomer's training split, as `ServerContext.clients.batches` gives a training
        client's: the pieces of an algorithm's own local step (Per-FedAvg's adaptation)."""
        ...


def nearest_update_direction(
    newcomers: Newcomers, models: Tensor, members: Tensor, mask: Tensor | None = None
) -> Tensor:
    """(count,) for each newcomer, the cluster model whose direction from the centre (the members-weighted mean of
    the cluster models: one global model) is nearest in cosine to the newcomer's own update from the centre. A
    newcomer trains once, from one model every cluster also left; a cluster's direction is where its members'
    updates took it, so an update-clustering method (OCFL, CFL) places the newcomer by the criterion it clusters
    with. `mask` restricts the comparison to some entries (parameters without buffers)."""
    weights = members.to(models.dtype)
    centre = (weights[:, None] * models).sum(dim=0) / weights.sum()
    count = newcomers.count
    updates = newcomers.train_many(list(range(count)), centre.expand(count, -1)) - centre
    directions = models - centre
    if mask is not None:
        updates, directions = updates[:, mask], directions[:, mask]
    return nearest_direction(updates, directions)


def nearest_direction(updates: Tensor, directions: Tensor) -> Tensor:
    """(rows,) for each update (row), the direction (row) of largest cosine similarity with it."""
    return (unit_rows(updates) @ unit_rows(directions).T).argmax(dim=1)


def best_fitting(newcomers: Newcomers, models: Any) -> Tensor:
    """(newcomers,) the index of the model in `models` (a (k, d) tensor or `ClientModels`) with the lowest loss on
    each newcomer's training split (a NaN loss never wins): the stored client model that fits a newcomer best, for
    methods whose only models are the clients' own (Local, FedFomo, FedAMP)."""
    return torch.nan_to_num(newcomers.losses(models), nan=math.inf).argmin(dim=0)


def unit_rows(rows: Tensor) -> Tensor:
    """Each row divided by its norm (a zero row stays zero: cosine 0 with everything)."""
    return rows / rows.norm(dim=1, keepdim=True).clamp(min=1e-12)
