"""Clients that arrive after training: held out of every round (`data.init_args.holdout_clients`), then given a
model at each evaluation by `Algorithm.newcomer_models` and scored apart from the training clients (`unseen/*`).

`Newcomers` is what an algorithm sees of them: their data and ways to run a model on it, never their labels'
ground-truth clusters. A newcomer's local work (training from a start, losses) is seeded by (seed, round,
newcomer, "newcomer"), so an evaluation repeats exactly in a resumed run.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor

from fedlight.engine.data import ClientSplit


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
        """Every newcomer's samples of split `name` ("train", "val" or "test"), raw (`ServerContext.inputs`
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

    def train(self, newcomer: int, start: Tensor, epochs: int | None = None) -> Tensor:
        """The flat model after local training from `start` on one newcomer's training split with the module's
        `training_step` and optimizer (`epochs` defaults to the federation's local epochs): a newcomer's own update,
        for methods that cluster updates or weights (its update is the result minus `start`)."""
        ...
