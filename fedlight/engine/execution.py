"""Client execution: how a round's clients are trained, and where.

One `ExecutionPlan` is decided at set-up from the algorithm's declarations and the module: whether the round's
updates stream (running sums, one all-reduce) or are held (all-gathered in client order), whether clients train
vectorized, sequentially or as the probe decides in round 1 (and why), and whether a gradient hook runs after
every backward pass. It is printed in the run's start line and recorded in summary.json.

`ClientExecution` carries it out: every process trains its shard of the round's clients (`Collective.shard`), in
groups that fit in memory, through the vectorized trainer (`fedlight.training.vectorized`) or one client after
another (`fedlight.training.sequential`), or through the algorithm's own `train_client`; `round_updates` hands the
result to the algorithm as a `RoundUpdates`.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlight.engine.devices import available_memory
from fedlight.engine.processes import Collective
from fedlight.engine.round_updates import RoundUpdates
from fedlight.engine.updates import Updates
from fedlight.training.probe import (AGREEMENT, CHECK_CLIENTS, ProbeResult, agreement, decide, device_name, probe_key,
                                     recall, remember, sequential_share, step_seconds, timed, without_dropout)
from fedlight.training.sequential import ClientTrainer, Trained
from fedlight.training.vectorized import VectorizedTrainer, unsupported_reason

if TYPE_CHECKING:
    from fedlight.engine.algorithm import Algorithm
    from fedlight.engine.config import FederationConfig
    from fedlight.engine.server import ServerContext

CPU_GROUP = 256  # most clients per group on a CPU: plenty for full-width vectorized steps


def stacked_starts(models: list[Tensor]) -> Tensor:
    """The clients' starting models as rows. When every client starts from one model (FedAvg, every round before a
    clustered method splits), that model once, expanded to every row: a held round of m clients then keeps one model
    for its starts, not m copies (1.3 GB for 15 ResNet-34 clients). A copy, so that the server's later writes into
    its models never change a round's starts."""
    first = models[0]
    same = all(m.data_ptr() == first.data_ptr() and m.shape == first.shape and m.stride() == first.stride()
               for m in models[1:])
    return first.clone().expand(len(models), *first.shape) if same else torch.stack(models)


@dataclass
class ExecutionPlan:
    """How rounds run (decided at set-up; `trainer` "auto" becomes the probe's choice in round 1).

    Attributes:
        updates: "stream" (a group at a time, running sums) or "hold" (every update at once, in client order).
        trainer: "vectorized", "sequential" or "auto" (the probe times both in round 1 and keeps the faster).
        reason: why clients train one after another, when they do.
        gradient_hook: whether the algorithm edits every client's gradient after each backward pass.
        processes: how many processes share each round's clients.
        threads: torch's CPU threads per process, and where that number comes from (`fedlight.engine.threads`).
        hold_reason: why the round is held though the algorithm streams (a robust aggregator that needs every
            update of a cluster); None otherwise.
    """

    updates: str
    trainer: str
    reason: str | None
    gradient_hook: bool
    processes: int
    threads: int = 1
    threads_from: str = ""
    hold_reason: str | None = None

    def describe(self) -> str:
        """One line for the start of a run."""
        updates = ("updates streamed in groups (running sums)" if self.updates == "stream" else
                   f"every update held ({self.hold_reason or 'the algorithm compares them'})")
        trainer = {"auto": "trainer chosen by timing both in round 1", "vectorized": "clients trained vectorized",
                   "sequential": f"clients trained one after another ({self.reason})"}[self.trainer]
        hook = ", gradient hook after every backward pass" if self.gradient_hook else ""
        spread = f", {self.processes} processes" if self.processes > 1 else ""
        threads = f"; {self.threads} CPU thread{'s' if self.threads != 1 else ''} ({self.threads_from})"
        return f"{updates}; {trainer}{hook}{spread}{threads}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class ClientExecution:
    """Trains the clients of each round as the plan says, on this process's shard of them."""

    def __init__(self, algorithm: "Algorithm", server: "ServerContext", trainer: ClientTrainer,
                 config: "FederationConfig", collective: Collective, threads: tuple[int, str] = (1, ""),
                 hold_reason: str | None = None,
                 tamper: Callable[[int, list[int], Tensor, Tensor], Tensor] | None = None) -> None:
        self.algorithm, self.server, self.trainer = algorithm, server, trainer
        self.config, self.collective = config, collective
        self.holds = algorithm.holds_updates or hold_reason is not None
        self.tamper = tamper  # what attackers do to their trained models (`fedlight.engine.attacks`), or None
        self.device = server.device
        self.probe_result: ProbeResult | None = None  # what `vectorize: -1` measured and chose
        self.vectorized: VectorizedTrainer | None = None
        self._activation_bytes: int | None = None  # measured once, when a group size first needs it
        trainer_kind, reason = self._choose_trainer()
        self.plan = ExecutionPlan("hold" if self.holds else "stream", trainer_kind, reason,
                                  algorithm.corrects_gradient, collective.world, *threads,
                                  hold_reason=None if algorithm.holds_updates else hold_reason)

    def _choose_trainer(self) -> tuple[str, str | None]:
        if self.algorithm.own_training:
            return "sequential", f"{type(self.algorithm).__name__} trains its clients itself (train_client)"
        if not self.config.vectorize:
            return "sequential", "federation.vectorize is 0"
        trainer = self.trainer
        reason = unsupported_reason(trainer.module, trainer.raw_optimizer, trainer.scaler)
        if reason:
            warnings.warn(f"vectorized training is off: {reason}; clients train one after another", stacklevel=3)
            return "sequential", reason
        self.vectorized = VectorizedTrainer(trainer.fabric, trainer.module, trainer.flat, trainer.raw_optimizer,
                                            trainer.learning_rates, trainer.batch_transform, self.config.batch_size,
                                            self.config.local_epochs)
        return ("auto" if self.config.vectorize == -1 else "vectorized"), None

    def _train_sequentially_from_now(self, reason: str) -> None:
        self.vectorized = None
        self.plan.trainer, self.plan.reason = "sequential", reason

    # -- a round ---------------------------------------------------------------------------------------------
    def round_updates(self, round: int, clients: list[int]) -> RoundUpdates:
        """The round's updates, trained when the algorithm asks for them."""
        alg = self.algorithm
        mine = self.collective.shard(clients)  # every client, unless the round is spread over processes
        if self.holds:
            groups = [mine]
        else:
            size = self.group_size(len(mine))
            groups = [mine[begin: begin + size] for begin in range(0, len(mine), size)]
        rate = None if alg.own_training else \
            self.trainer.learning_rates.round_rate(round, self.local_steps(clients)) * alg.learning_rate_scale(round)
        return RoundUpdates(clients, self.holds, groups, lambda group: self.train(round, group),
                            self.collective, self.server.num_clients, rate)

    def train(self, round: int, clients: list[int]) -> Updates:
        """Local training of `clients`: in groups through the vectorized trainer when the plan allows, else one
        after another (the algorithm's own `train_client`, or the module's SGD)."""
        alg = self.algorithm
        starts = stacked_starts([alg.client_model(c) for c in clients])
        trained = self._try_vectorized(round, clients, starts) if self.vectorized is not None else None
        if trained is None:
            trained = self._train_one_by_one(round, clients, starts)
        if self.tamper is not None:
            trained.params = self.tamper(round, clients, starts, trained.params)
        ids = torch.tensor(clients, device=self.device)
        return Updates(ids, trained.params, starts, self.server.train_sizes[ids], trained.loss, trained.logs,
                       trained.state)

    def _train_one_by_one(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Written in place, so the trained models are never held twice."""
        alg = self.algorithm
        params, losses = torch.empty_like(starts), torch.empty(len(clients), device=self.device)
        logs: dict[str, Tensor] = {}
        state: dict[str, Tensor] = {}
        for row, (client, start) in enumerate(zip(clients, starts)):
            if alg.own_training:
                params[row], losses[row], *extra = alg.train_client(round, client, start)
                for name, value in (extra[0] if extra else {}).items():
                    state.setdefault(name, value.new_empty((len(clients), *value.shape)))[row] = value
                continue
            x, y = self.server.split("train").client(client)
            one = self.trainer.fit(start, x, y, self.server.client_seed(round, client), self._gradient_hook(client),
                                   alg.learning_rate_scale(round), round=round)
            params[row], losses[row] = one.params, one.loss
            for name, value in one.logs.items():
                logs.setdefault(name, torch.full((len(clients),), float("nan"), device=self.device))[row] = value
        return Trained(params, losses, logs, state)

    def _try_vectorized(self, round: int, clients: list[int], starts: Tensor) -> Trained | None:
        """Vectorized training (round 1 under auto: the probe's split, `_train_and_probe`), or None (and sequential
        training from then on) when the module's training step fails under torch.func, e.g. because it reads values
        back with .item()."""
        try:
            if self.plan.trainer == "auto" and self.probe_result is None:
                return self._train_and_probe(round, clients, starts)
            return self._train_vectorized(round, clients, starts)
        except Exception as error:  # any failure inside vmap: the module is not vectorizable
            reason = f"training_step failed under torch.func ({error!r})"
            warnings.warn(f"vectorized training is off: {reason}; clients train one after another", stacklevel=2)
            self._train_sequentially_from_now(reason)
            return None

    def _train_vectorized(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        size = self.group_size(len(clients))
        parts = []
        for begin in range(0, len(clients), size):
            group = clients[begin: begin + size]
            parts.append(self.vectorized.fit_many(
                starts[begin: begin + size], [self.server.split("train").client(c) for c in group],
                [self.server.client_seed(round, c) for c in group], self._row_hook(group),
                lr_scale=self.algorithm.learning_rate_scale(round), round=round))
        return Trained.cat(parts)

    def _train_and_probe(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The first group's training under auto, timed (`fedlight.training.probe`): its first `sequential_share`
        clients one after another, client by client; then, if the agreement check passes, the rest of the group
        vectorized. The faster per client step (or the decision this machine remembers) trains the rest of
        `clients` and every later round. The same clients train each way whatever the decision, so a remembered
        decision gives the numbers of a measured one."""
        group = clients[: self.group_size(len(clients))]
        key = probe_key(model=type(self.trainer.module).__qualname__, params=self.trainer.flat.numel,
                        batch_size=self.config.batch_size, clients=len(group),
                        gradient_hook=self.algorithm.corrects_gradient, precision=self._precision_name(),
                        device=device_name(self.device))
        remembered = self._recall(key)
        first = sequential_share(len(group))
        parts, seconds = [], []
        for row in range(first):
            one, spent = timed(self.device, lambda: self._train_one_by_one(round, clients[row: row + 1],
                                                                           starts[row: row + 1]))
            parts.append(one)
            seconds.append(spent)
        rest, rest_starts = clients[first: len(group)], starts[first: len(group)]
        difference = remembered.difference if remembered else \
            self.collective.broadcast(self._check_agreement(round, rest, rest_starts) if rest else 0.0)
        vectorizes = bool(rest) and difference <= AGREEMENT
        if vectorizes:
            trained, vectorized_s = timed(self.device, lambda: self._train_vectorized(round, rest, rest_starts))
            vectorized_s /= sum(self.server.local_steps(c) for c in rest)
        else:
            trained, vectorized_s = self._train_one_by_one(round, rest, rest_starts), math.nan
        parts.append(trained)
        sequential_s = step_seconds(seconds, [self.server.local_steps(c) for c in clients[:first]])
        result = remembered or self.collective.broadcast(
            decide(first, len(rest) if vectorizes else 0, sequential_s, vectorized_s, difference))
        if remembered is None and self.collective.rank == 0:
            remember(key, result)
        self._keep_probe(result)
        if len(clients) > len(group):
            later, later_starts = clients[len(group):], starts[len(group):]
            parts.append(self._train_vectorized(round, later, later_starts) if self.vectorized is not None else
                         self._train_one_by_one(round, later, later_starts))
        return Trained.cat(parts)

    def _recall(self, key: str) -> ProbeResult | None:
        """The decision this machine remembers under `key` (the first process's memory, for every process)."""
        remembered = recall(key) if self.collective.rank == 0 else None
        return self.collective.broadcast(remembered) if self.collective.broadcast(remembered is not None) else None

    def _check_agreement(self, round: int, clients: list[int], starts: Tensor) -> float:
        """One local step on each client's first batch, dropout off: `clients` vectorized (the warm-up of the
        trainer at the group size it is then timed at: a first call costs 20-30 % more per step) and the first
        `CHECK_CLIENTS` of them sequentially; how far the vectorized models are from the sequential ones."""
        seeds = [self.server.client_seed(round, c) for c in clients]
        lr_scale = self.algorithm.learning_rate_scale(round)
        batch = self.config.batch_size
        data = [(x[:batch], y[:batch]) for x, y in (self.server.split("train").client(c) for c in clients)]
        with without_dropout(self.trainer.module):
            vectorized = self.vectorized.fit_many(starts, data, seeds, self._row_hook(clients), lr_scale, round,
                                                  epochs=1).params[:CHECK_CLIENTS]
            sequential = torch.stack([self.trainer.fit(start, x, y, seed, self._gradient_hook(c), lr_scale, epochs=1,
                                                       round=round).params
                                      for start, (x, y), seed, c in zip(starts, data, seeds, clients[:CHECK_CLIENTS])])
        return agreement(sequential, vectorized, starts[: len(sequential)])

    def _precision_name(self) -> str:
        plugin = self.trainer.fabric.strategy.precision
        return str(getattr(plugin, "precision", type(plugin).__name__))

    def _keep_probe(self, result: ProbeResult) -> None:
        self.probe_result = result
        if result.choice == "sequential":
            self._train_sequentially_from_now(result.reason)
        else:
            self.plan.trainer = "vectorized"

    def _gradient_hook(self, client: int) -> Callable | None:
        """The algorithm's gradient correction for one client's sequential training (None without one)."""
        alg = self.algorithm
        if not alg.corrects_gradient:
            return None
        return lambda params, grad, start: alg.local_gradient(client, params, grad, start)

    def _row_hook(self, group: list[int]) -> Callable | None:
        """The same for the rows of a vectorized group."""
        alg = self.algorithm
        if not alg.corrects_gradient:
            return None
        return lambda row, params, grad, start: alg.local_gradient(group[row], params, grad, start)

    def local_steps(self, clients: list[int]) -> int:
        """Local optimizer steps of the longest of `clients` in a round (its batches times the local epochs)."""
        longest = int(self.server.train_sizes[clients].max()) if clients else 0
        return max(1, -(-longest // self.config.batch_size) * self.config.local_epochs)

    def group_size(self, clients: int) -> int:
        """Clients trained (vectorized) or aggregated together: `vectorize` when it is a count; otherwise as
        many as half the free memory holds (on a CPU also at most `CPU_GROUP`), counting for each client its
        parameters, gradients, optimizer state and temporaries, and, when it may train vectorized, twice the
        activations its step keeps (`activation_bytes`: the saved tensors, then their gradients)."""
        if self.config.vectorize > 0:
            return self.config.vectorize
        flat = self.trainer.flat
        per_client = flat.numel * flat.vector.element_size() * 8 + 2 * self.activation_bytes()
        free = available_memory(self.device)
        fits = clients if free is None else max(1, int(0.5 * free // per_client))
        return min(clients, fits) if self.device.type == "cuda" else min(clients, fits, CPU_GROUP)

    def activation_bytes(self) -> int:
        """What one client's vectorized step keeps for backward, measured once on a full batch of the training
        data (`VectorizedTrainer.activation_bytes`); 0 when clients cannot train vectorized."""
        if self.vectorized is None:
            return 0
        if self._activation_bytes is None:
            split = self.server.split("train")
            batch = self.config.batch_size
            try:
                self._activation_bytes = self.vectorized.activation_bytes(split.x[:batch], split.y[:batch])
            except Exception:  # a step that cannot run here cannot run vectorized either: that path says why
                self._activation_bytes = 0
        return self._activation_bytes

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        return None if self.probe_result is None else self.probe_result.as_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is not None and self.plan.trainer == "auto":  # the resumed run keeps its choice
            self._keep_probe(ProbeResult(**state))
