"""Local training of one client at a time on ONE reused LightningModule (docs/architecture.md, "Speed").

The module's own `training_step` and `configure_optimizers` are used, so a user's LightningModule works
unchanged. Its optimizer is built once; between clients its state is cleared and its hyper-parameters
restored, which is the same as building a fresh one. Batches are gathered from the client's slice of the
split tensor on the device; no DataLoader is involved.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fedlight.training.flat import FlatModel
from fedlight.training.schedules import LearningRates, parse_optimizers
from fedlight.training.step_logs import LogSums, StepLogs
from fedlight.training.trainer_stand_in import TrainerStandIn
from fedlight.training.work_shares import WorkShares

if TYPE_CHECKING:  # type-only: importing Lightning costs seconds, and `fit --help` need not
    import lightning as L

GradientHook = Callable[[Tensor, Tensor, Tensor], None]


@dataclass
class Trained:
    """What local training gives back: the trained flat model(s), the mean loss of the last local epoch, and what
    `training_step` logged (`self.log`), each a value per client (or one value for a single client)."""

    params: Tensor
    loss: Tensor
    logs: dict[str, Tensor] = field(default_factory=dict)
    state: dict[str, Tensor] = field(default_factory=dict)  # what an algorithm's own local work sends beside

    @staticmethod
    def cat(parts: "list[Trained]", params: Tensor | None = None) -> "Trained":
        """The parts' clients in order, as one; a log that a part lacks is NaN for its clients (every part sends the
        same state). `params`: the parts' models already gathered in one (clients, d) tensor (their rows written in
        place as they arrived), used as they are instead of concatenated again."""

        def column(part: Trained, name: str) -> Tensor:
            value = part.logs.get(name)
            return value if value is not None else torch.full_like(part.loss, float("nan"))

        if len(parts) == 1:  # one group: itself, not a copy of its (clients, d) models
            return parts[0]
        names = dict.fromkeys(name for part in parts for name in part.logs)
        return Trained(
            torch.cat([p.params for p in parts]) if params is None else params,
            torch.cat([p.loss for p in parts]),
            {name: torch.cat([column(p, name) for p in parts]) for name in names},
            {name: torch.cat([p.state[name] for p in parts]) for name in parts[0].state},
        )


warnings.filterwarnings("ignore", message=r".*self\.log\(\)` but the `self\.trainer` reference is not registered.*")
# a self.log outside training_step (in forward, say) is skipped, as Lightning skips it with no Trainer attached
warnings.filterwarnings("ignore", message=r".*self\.log\(\)` but `Trainer\(barebones=True\)` is configured.*")


def training_loss(output) -> Tensor:
    """The loss out of what `training_step` returned (a tensor or a dict with 'loss')."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, dict) and "loss" in output:
        return output["loss"]
    raise TypeError("training_step must return the loss tensor or a dict with a 'loss' key")


def sample_loss(module: torch.nn.Module, outputs: Tensor, y: Tensor) -> Tensor:
    """(N,) each sample's loss from the module's outputs: its own `sample_loss(outputs, y)` when it has one (a
    language model's mean over its response tokens), else the cross-entropy of class logits."""
    own = getattr(module, "sample_loss", None)
    return own(outputs, y) if own is not None else F.cross_entropy(outputs, y, reduction="none")


def weighted_loss(module: torch.nn.Module, batch: Any, weights: Tensor) -> Tensor:
    """The batch mean of weight x each sample's loss (`sample_loss`) on (x, y): the per-sample weighted negative
    log-likelihood a mixture's M-step minimizes (FedEM), where `training_step` has no per-sample weights."""
    x, y = batch
    return (weights * sample_loss(module, module(x), y)).mean()


#: the loss of one batch in place of `training_step`: objective(module, (x, y), inputs), `inputs` the client's row of
#: `LocalWork.client_inputs` (an empty tensor without them); the module runs with the client's weights, vectorized or
#: alone (`LocalWork.objective`)
Objective = Callable[[torch.nn.Module, Any, Tensor], Tensor]


def step_loss(
    module: L.LightningModule,
    batch: Any,
    step: int,
    weights: Tensor | None = None,
    objective: Objective | None = None,
    inputs: Tensor | None = None,
) -> Tensor:
    """The loss a local step minimizes: the algorithm's `objective` when it gives one, else the weighted
    cross-entropy when samples are weighted, else the module's `training_step`."""
    if objective is not None:
        return objective(module, batch, batch[0].new_zeros(0) if inputs is None else inputs)  # none: an empty row
    if weights is not None:
        return weighted_loss(module, batch, weights)
    return training_loss(module.training_step(batch, step))


def seed_random_layers(seed: int, device: torch.device) -> None:
    """Seed the generator that dropout and other random layers draw from on `device` (torch.manual_seed seeds
    every backend, which costs a traceback per lazily initialized one at every call)."""
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def sample_order(n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """An epoch's order of a client's n samples, drawn on the CPU from `generator` (a CPU generator) and moved to
    `device`: the same seed gives the same batches on every device (a CUDA generator draws other permutations)."""
    return torch.randperm(n, generator=generator).to(device, non_blocking=True)


class ClientTrainer:
    """Trains the shared module from a given flat model on one client's data and returns the result. The module is
    attached to `stand_in` (what it reads as `self.trainer`, `fedlight.training.trainer_stand_in`) before its
    `configure_optimizers` runs, and told where local training is at every step. `work_shares` holds the share of
    its steps each client of the current round finishes (`fedlight.training.work_shares`: partial work)."""

    def __init__(
        self,
        fabric: L.Fabric,
        module: L.LightningModule,
        flat: FlatModel,
        batch_transform: Callable,
        batch_size: int,
        local_epochs: int,
        stand_in: TrainerStandIn,
    ) -> None:
        self.fabric = fabric
        self.module = module
        self.flat = flat
        self.batch_transform = batch_transform
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        self.stand_in = stand_in
        # as Trainer.fit attaches itself, for configure_optimizers and training_step (a stand-in, not a Trainer)
        module.trainer = stand_in  # type: ignore[assignment]
        raw, schedulers = parse_optimizers(module.configure_optimizers())
        self.learning_rates = LearningRates(raw, schedulers)
        optimizer = fabric.setup_optimizers(raw)
        assert not isinstance(optimizer, tuple)  # one optimizer in, one out
        self.optimizer = optimizer
        self.raw_optimizer = raw
        self.initial_groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in raw.param_groups]
        self.scaler = getattr(fabric.strategy.precision, "scaler", None)
        # Fabric's single-device backward and step come down to these two calls unless a gradient scaler is in
        # play; called directly they skip several layers of Python at every one of many small steps
        self.backward = fabric.backward if self.scaler else Tensor.backward
        self.step = self.optimizer.step if self.scaler else raw.step
        self.objective: Objective | None = None  # set for a call by the group training (`LocalWork.objective`)
        self.work_shares = WorkShares()

    def local_steps(self, samples: int, epochs: int | None = None) -> int:
        """Optimizer steps of local training on `samples` rows: the batches times `epochs` (default: the local
        epochs)."""
        return -(-samples // self.batch_size) * (self.local_epochs if epochs is None else epochs)

    def reset_optimizer(self) -> None:
        """Forget momentum/Adam statistics and restore the configured hyper-parameters."""
        self.raw_optimizer.state.clear()
        for group, initial in zip(self.raw_optimizer.param_groups, self.initial_groups):
            group.update(initial)

    def fit(
        self,
        start: Tensor,
        x: Tensor,
        y: Tensor,
        seed: int,
        gradient_hook: GradientHook | None = None,
        lr_scale: float = 1.0,
        epochs: int | None = None,
        round: int = 1,
        sample_weights: Tensor | None = None,
        inputs: Tensor | None = None,
        max_steps: int | None = None,
        out: Tensor | None = None,
    ) -> Trained:
        """Train from `start` on (x, y) for `epochs` (default: the configured local epochs) at the learning rates
        of round `round` times `lr_scale`: the trained flat model, the mean loss of the last epoch and the values
        `training_step` logged. All randomness (batch order, dropout) derives from `seed`. With `sample_weights`
        (one per row of x), each step's loss is `weighted_loss` instead of `training_step`; with an `objective` set,
        it is the objective's, handed `inputs` (`step_loss`). `max_steps`: stop after that many steps (partial work,
        `fedlight.training.work_shares`); the loss is then the mean of the steps of the last epoch begun. `out`: a
        (d,) tensor the trained model is written into and returned as (one copy, no new tensor: a caller gathering
        a round's models in one (clients, d) tensor saves a copy of each, and fresh memory's page faults)."""
        module, flat = self.module, self.flat
        flat.load(start)
        if gradient_hook is not None:  # `fresh_gradients` starts from None gradients and leaves `flat.grad` zeroed
            flat.zero_grad()
        self.reset_optimizer()
        module.train()
        n, b = len(y), self.batch_size
        steps, epochs = -(-n // b), self.local_epochs if epochs is None else epochs
        rates = self.learning_rates.rates(round, steps * epochs)
        loss_sum = torch.zeros((), device=x.device)
        taken = last_epoch_steps = 0
        logs = LogSums(1, x.device)
        # without a hook nothing reads the flat gradient: backward may hand over new gradients (FlatModel)
        fresh = flat.fresh_gradients() if gradient_hook is None else contextlib.nullcontext(flat.zero_grad)
        with StepLogs(module) as step_logs, fresh as clear_gradients:
            for epoch, step, rows in self.batch_rows(n, seed, epochs, x.device):
                if taken == max_steps:
                    break
                batch = self.batch_transform((x[rows], y[rows]), 0)
                if step == 0:
                    loss_sum.zero_()
                    logs.clear()
                self.stand_in.at(round, epoch, step)
                with self.fabric.autocast():
                    loss = step_loss(
                        module,
                        batch,
                        step,
                        None if sample_weights is None else sample_weights[rows],
                        self.objective,
                        inputs,
                    )
                logs.add(step_logs.take(), 0, min(b, n - step * b))
                self.backward(loss)
                if gradient_hook is not None:
                    if self.scaler is not None:
                        self.scaler.unscale_(self.raw_optimizer)
                    gradient_hook(flat.vector, flat.grad, start)
                for group, lr in zip(self.raw_optimizer.param_groups, rates[epoch * steps + step]):
                    group["lr"] = lr * lr_scale
                self.step()
                clear_gradients()
                loss_sum += loss.detach().float()
                taken, last_epoch_steps = taken + 1, step + 1
        counted = steps if max_steps is None else last_epoch_steps
        trained = flat.read() if out is None else out.copy_(flat.vector)
        return Trained(trained, loss_sum / counted, {name: value[0] for name, value in logs.means().items()})

    def batch_rows(
        self, n: int, seed: int, epochs: int | None, device: torch.device
    ) -> Iterator[tuple[int, int, Tensor]]:
        """(epoch, step, rows) of local epochs over n samples: a permutation per epoch from a generator seeded by
        `seed`, which also seeds the random layers (dropout)."""
        seed_random_layers(seed, device)
        generator = torch.Generator().manual_seed(seed)
        b = self.batch_size
        for epoch in range(self.local_epochs if epochs is None else epochs):
            order = sample_order(n, generator, device)
            for step, begin in enumerate(range(0, n, b)):
                yield epoch, step, order[begin : begin + b]

    def batches(
        self, x: Tensor, y: Tensor, seed: int, epochs: int | None = None, round: int = 1
    ) -> Iterator[tuple[int, int, Any]]:
        """(epoch, step, batch) of a client's local epochs on (x, y), converted as the module sees them, in the order
        `fit` takes them (`batch_rows`), so a custom local loop (`ServerContext.clients.batches`) draws what `fit`
        would; the module's trainer is told each step's place in round `round`, as `fit` tells it."""
        for epoch, step, rows in self.batch_rows(len(y), seed, epochs, x.device):
            self.stand_in.at(round, epoch, step)
            yield epoch, step, self.batch_transform((x[rows], y[rows]), 0)

    def loss_and_grad(self, params: Tensor, batch: Any, step: int = 0) -> tuple[Tensor, Tensor]:
        """(loss, flat gradient) of the module's `training_step` on `batch` at the flat model `params`, in training
        mode and the run's precision: one step of a custom local loop (no optimizer, no gradient scaling)."""
        self.flat.load(params)
        self.flat.zero_grad()
        self.module.train()
        with StepLogs(self.module), self.fabric.autocast():
            loss = training_loss(self.module.training_step(batch, step))
        loss.backward()
        return loss.detach().float(), self.flat.grad.clone()
