"""`ClientPopulation`: one set of clients and their data, run through the federation's module, trainer and seeds.

The training clients (`server.clients`) and the clients held out of training (the engine's `Newcomers`) are
two populations of one class, so their sizes, splits, losses, per-sample losses and local training are the same
code: a newcomer is run exactly as a training client would be.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.client_work import ClientWork
from fedlight.plugin.data import SPLITS, ClientSplit, FederatedData
from fedlight.training.group_batches import GroupStep, group_steps
from fedlight.training.local_work import LocalWork
from fedlight.training.sequential import ClientTrainer, GradientHook, Objective, Trained
from fedlight.training.vectorized import GroupHook

GroupTrainer = Callable[[int, list[int], Tensor, LocalWork], Trained]
"""(round, clients, starts, work) -> the clients trained as one group (the engine's group training)."""


class ClientPopulation:
    """Clients 0..count-1 of `data` (their own numbering), with ways to run flat models on them.

    Args:
        data: the clients' samples.
        sample_loss: (flat model, raw inputs, labels) -> each sample's loss, in batched passes (the module's outputs
            through its loss: `ServerContext.model.outputs` and `sample_loss`).
        trainer: the module's local training (its optimizer, batch size and local epochs).
        seed_of: (round, client, purpose) -> the seed of a client's local work (`server.random.client_seed`).
        train_group: the engine's group training of these clients (`bind_group_training` sets it later).

    Attributes:
        count: how many clients there are.
        train_sizes: (count,) their training-set sizes, on the data's device.
        aggregation_weights: (count,) what each one's update weighs in aggregation (`Updates.num_samples`).
        work: what each client's work ran (`fedlight.plugin.client_work`), which the virtual clock charges.
    """

    def __init__(
        self,
        data: FederatedData,
        sample_loss: Callable[[Tensor, Tensor, Tensor], Tensor],
        trainer: ClientTrainer,
        seed_of: Callable[[int, int, str], int],
        train_group: GroupTrainer | None = None,
    ) -> None:
        self.data, self.sample_loss, self.trainer, self.seed_of = data, sample_loss, trainer, seed_of
        self._stepping: list[int] = []  # the clients whose batch a custom loop drew last (`gradient_pass`)
        self._train_group = train_group
        self.count = data.num_clients
        self.train_sizes = torch.as_tensor(data.train.sizes(), device=data.train.x.device)
        #: what each client's update weighs in the engine's aggregation (`Updates.num_samples`): its training-set
        #: size, or 1 where clients are already sampled by size (`system.selection: data_size`)
        self.aggregation_weights = self.train_sizes
        self._rows = {name: data.split(name).client_of_row() for name in SPLITS}
        self.work = ClientWork(self.count)

    def bind_group_training(self, train_group: GroupTrainer) -> None:
        """The engine's group training, which `train_many` hands its work to (set once the engine's plan is made)."""
        self._train_group = train_group

    # -- data ------------------------------------------------------------------------------------------------
    def split(self, name: str) -> ClientSplit:
        """Every client's samples of split `name` ("train", "val" or "test"), raw."""
        return self.data.split(name)

    def client_of_row(self, split: str) -> Tensor:
        """(rows,) the client each row of split `split` belongs to."""
        return self._rows[split]

    # -- losses ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def losses(self, models: Tensor, split: str = "train", clients: list[int] | None = None) -> Tensor:
        """(K, clients) mean loss (a classifier's cross-entropy) of each of K flat models on each client's split, one
        batched pass over the split per model (to pick a model by loss: IFCA, FLIS); NaN for a client without samples
        in the split. `clients`: only theirs, in that order (a round's cohort: the passes then cover their rows, not
        the split's); None: every client."""
        data, owner, count = self.split(split), self._rows[split], self.count
        if clients is not None:
            data = data.select(np.asarray(clients, dtype=np.int64))
            owner, count = data.client_of_row(), len(clients)
        counts = torch.bincount(owner, minlength=count)
        self.work.forward(range(count) if clients is None else clients, counts.tolist(), len(models))
        losses = torch.empty(len(models), count, device=data.y.device)
        for j, params in enumerate(models):
            losses[j] = (
                torch.bincount(owner, weights=self.sample_loss(params, data.x, data.y), minlength=count) / counts
            )
        return losses

    @torch.no_grad()
    def sample_losses(self, models: Tensor, clients: list[int] | None = None) -> tuple[Tensor, Tensor]:
        """((K, rows) loss of each flat model on every training row, (rows,) the client of each row): what
        a mixture's E-step needs (FedEM). `clients`: only their rows, client after client (default: every row)."""
        train = self.data.train
        if clients is None:
            self.work.forward(range(self.count), self.train_sizes.tolist(), len(models))
            return self._per_sample(models, train.x, train.y), self._rows["train"]
        parts = [train.client(c) for c in clients]
        sizes = torch.as_tensor([len(y) for _, y in parts], device=train.y.device)
        self.work.forward(clients, sizes.tolist(), len(models))
        owner = torch.repeat_interleave(torch.as_tensor(clients, dtype=torch.long, device=train.y.device), sizes)
        return self._per_sample(models, torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])), owner

    def _per_sample(self, models: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """(K, len(y)) loss of each flat model on each sample."""
        if not len(models):
            return torch.zeros(0, len(y), device=y.device)
        return torch.stack([self.sample_loss(params, x, y) for params in models])

    # -- local training --------------------------------------------------------------------------------------
    def train(
        self,
        round: int,
        client: int,
        start: Tensor,
        epochs: int | None = None,
        lr_scale: float = 1.0,
        gradient_hook: GradientHook | None = None,
        purpose: str = "train",
        sample_weights: Tensor | None = None,
    ) -> Trained:
        """Train the model from `start` on one client's training split with the module's `training_step` and
        optimizer, seeded by (seed, round, client); returns its `Trained` (`params`, the trained flat model; `loss`,
        the mean loss of the last epoch). `epochs` defaults to the federation's local epochs; `gradient_hook(params,
        grad, start)` may edit the flat gradient in place after each backward pass; another `purpose` draws another
        stream of batches (a personal model's training beside the global one, fine-tuning). `sample_weights`, one per
        row of the client's training split, replace `training_step`'s loss with the batch mean of weight x
        cross-entropy of the module's outputs (a mixture component's M-step, FedEM). A set-up phase numbered 0
        trains at round 1's rates."""
        x, y = self.data.train.client(client)
        max_steps = self._max_steps(client, epochs)
        self.work.trained([client], [self.steps_this_round(client, epochs)])
        return self.trainer.fit(
            start,
            x,
            y,
            self.seed_of(round, client, purpose),
            gradient_hook,
            lr_scale=lr_scale,
            epochs=epochs,
            round=max(round, 1),
            sample_weights=sample_weights,
            max_steps=max_steps,
        )

    def train_many(
        self,
        round: int,
        clients: list[int],
        starts: Tensor,
        epochs: int | None = None,
        lr_scale: float = 1.0,
        gradient_hook: GroupHook | None = None,
        trainable: Tensor | None = None,
        sample_weights: list[Tensor] | None = None,
        purpose: str = "train",
        objective: Objective | None = None,
        client_inputs: Tensor | None = None,
    ) -> Trained:
        """Train `clients` from the rows of `starts` with the module's `training_step` and optimizer, as `train`
        does for each alone (same batches, same seeds), but as one group: vectorized when the run's plan allows,
        in groups sized by memory. Returns a `Trained` (models (len(clients), d), each client's mean loss of the last
        epoch, what `training_step` logged). `gradient_hook(rows, params, grad, starts)` edits the gradients of
        the clients at positions `rows` in place after every backward pass; `trainable` ((d,) bool) trains only
        those entries, the others keep their starting values; `sample_weights` (one tensor per client, a weight
        per row of its training split) weight each sample's cross-entropy; another `purpose` draws another stream
        of batches; `objective(module, (x, y), inputs)` is each step's loss instead of `training_step`, handed the
        client's row of `client_inputs` (`fedlight.training.local_work.LocalWork`)."""
        if self._train_group is None:
            raise RuntimeError(
                "ClientPopulation.train_many before the engine bound its group training: call bind_group_training first"
            )
        work = LocalWork(epochs, lr_scale, gradient_hook, trainable, sample_weights, purpose, objective, client_inputs)
        clients = list(clients)
        self.work.trained(clients, [self.steps_this_round(c, epochs) for c in clients])
        return self._train_group(round, clients, starts, work)

    def learning_rate(self, round: int) -> float:
        """The clients' configured learning rate at the start of round `round` (the module's optimizer and its
        schedulers, first parameter group)."""
        return self.trainer.learning_rates.round_rate(max(round, 1))

    def batches(
        self, round: int, client: int, epochs: int | None = None, purpose: str = "train"
    ) -> Iterator[tuple[int, int, Any]]:
        """(epoch, step, batch) of one client's training split, converted as the model sees them: the batches
        `train` takes in this round for this purpose (its share of them when the round cuts it short)."""
        x, y = self.data.train.client(client)
        batches = self.trainer.batches(x, y, self.seed_of(round, client, purpose), epochs, max(round, 1))
        self.work.began([client])
        try:
            for batch in itertools.islice(batches, self._max_steps(client, epochs)):
                self._stepping = [client]
                yield batch
        finally:
            self._stepping = []

    def group_batches(
        self, round: int, clients: list[int], epochs: int | None = None, purpose: str = "train"
    ) -> Iterator[GroupStep]:
        """The steps of a custom loop of a group of clients at once, each client's batches those `batches` gives it
        (for a custom local loop with `server.model.group_loss_and_grad`); the module's trainer is told each step's
        place in the round, as the trainers tell it."""
        data = [self.data.train.client(c) for c in clients]
        seeds = [self.seed_of(round, c, purpose) for c in clients]
        epochs = self.trainer.local_epochs if epochs is None else epochs
        limits = [self._max_steps(c, epochs) for c in clients] if self.trainer.work_shares.cuts(clients) else None
        self.work.began(clients)
        try:
            for step in group_steps(
                data,
                seeds,
                self.trainer.batch_size,
                epochs,
                self.trainer.batch_transform,
                self.train_sizes.device,
                limits,
            ):
                self.trainer.stand_in.at(max(round, 1), step.epoch, step.step)
                self._stepping = [clients[row] for row in step.rows]
                yield step
        finally:
            self._stepping = []

    def gradient_pass(self) -> None:
        """Count a gradient pass of a custom loop (`server.model.loss_and_grad`, `group_loss_and_grad`) as a step of
        the clients whose batch it last drew: two models' gradients on one batch are two steps (APFL), K inner
        iterations K steps (pFedMe); a pass outside such a loop is the server's and counts for no client."""
        self.work.stepped(self._stepping)

    def steps_this_round(self, client: int, epochs: int | None = None) -> int:
        """The optimizer steps `client` takes in this round's local work: its `local_steps`, or fewer when the round
        cuts its work short (the system model's partial work). FedNova normalizes by them; SCAFFOLD divides by them."""
        cut = self._max_steps(client, epochs)
        return self.local_steps(client, epochs) if cut is None else cut

    def forward_passes(self, clients: list[int], models: int) -> None:
        """Count, for the clock, `models` more forward passes over the samples each of `clients` trains on in this
        round: frozen models run inside a local objective (MOON's global and previous models, FedCP's global body),
        which the steps alone do not count. They are not counted as models received."""
        batch, epochs = self.trainer.batch_size, self.trainer.local_epochs
        samples = [min(self.steps_this_round(c) * batch, int(self.train_sizes[c]) * epochs) for c in clients]
        self.work.forward(clients, samples, models, received=False)

    def optimizer_settings(self) -> tuple[str, dict[str, Any]]:
        """(the class name of the module's optimizer, e.g. "SGD"; its first parameter group's configured settings:
        lr, momentum, dampening, nesterov, weight_decay, ...), for a method whose rule depends on the local
        optimizer."""
        settings = self.trainer.initial_groups[0] if self.trainer.initial_groups else {}
        return type(self.trainer.raw_optimizer).__name__, dict(settings)

    def _max_steps(self, client: int, epochs: int | None) -> int | None:
        """The steps `client` takes of its local work when the round cuts it short (partial work), else None."""
        shares = self.trainer.work_shares
        return shares.steps(client, self.local_steps(client, epochs)) if shares.cuts([client]) else None

    def local_steps(self, client: int, epochs: int | None = None) -> int:
        """Optimizer steps of one client's local training: its batches times `epochs` (default: the local epochs)."""
        return self.trainer.local_steps(int(self.train_sizes[client]), epochs)
