"""Client execution: how a round's clients are trained, and where.

One `ExecutionPlan` is decided at set-up from the algorithm's declarations and the module: whether the round's
updates stream (running sums, one all-reduce) or are held (all-gathered in client order), whether clients train
vectorized, sequentially or as the probe decides in round 1 (and why), and whether a gradient hook runs after
every backward pass. It is printed in the run's start line and recorded in summary.json.

`ClientExecution` carries it out: every process trains its shard of the round's clients (`Collective.shard`), in
groups that fit in memory, through the algorithm's `train_group` (by default the module's SGD, and every call of
`ServerContext.clients.train_many`: `fedlight.engine.group_training`, vectorized or one client after another), or one
client at a time through the algorithm's own `train_client`; `round_updates` hands the result to the algorithm as a
`RoundUpdates`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlight.engine.group_training import GroupTraining
from fedlight.engine.processes import Collective
from fedlight.plugin.round_updates import RoundUpdates
from fedlight.plugin.round_work import Arrivals, RoundWork
from fedlight.plugin.updates import Updates
from fedlight.training.local_work import LocalWork
from fedlight.training.probe import ProbeResult
from fedlight.training.sequential import ClientTrainer, Trained
from fedlight.training.vectorized import VectorizedTrainer

if TYPE_CHECKING:
    from fedlight.plugin.algorithm import Algorithm
    from fedlight.engine.config import FederationConfig
    from fedlight.plugin.server import ServerContext


def stacked_starts(models: list[Tensor]) -> Tensor:
    """The clients' starting models as rows. When every client starts from one model (FedAvg, every round before a
    clustered method splits), that model once, expanded to every row: a held round of m clients then keeps one model
    for its starts, not m copies (1.3 GB for 15 ResNet-34 clients). A copy, so that the server's later writes into
    its models never change a round's starts."""
    first = models[0]
    same = all(
        m.data_ptr() == first.data_ptr() and m.shape == first.shape and m.stride() == first.stride() for m in models[1:]
    )
    return first.clone().expand(len(models), *first.shape) if same else torch.stack(models)


def tampered_rows(
    tamper: Callable[[int, list[int], Tensor, Tensor], Tensor],
    round: int,
    clients: list[int],
    starts: Tensor,
    rows: Tensor,
) -> Tensor:
    """A model entry of (clients, ..., d) rows trained from `starts` (the same shape) as `tamper` leaves it: each
    client's every row tampered as its trained model would be."""
    d = rows.shape[-1]
    per_client = rows[0].numel() // d if len(rows) else 1
    owners = [client for client in clients for _ in range(per_client)]
    return tamper(round, owners, starts.reshape(-1, d), rows.reshape(-1, d)).reshape(rows.shape)


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
        every_client: what the algorithm does on every client rather than on the round's cohort, as it declared
            in its `setup` (`ServerContext.cohort.declare_every_client_work`): a cross-device run's cost that grows with
            all clients.
    """

    updates: str
    trainer: str
    reason: str | None
    gradient_hook: bool
    processes: int
    threads: int = 1
    threads_from: str = ""
    hold_reason: str | None = None
    every_client: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line for the start of a run."""
        updates = (
            "updates streamed in groups (running sums)"
            if self.updates == "stream"
            else f"every update held ({self.hold_reason or 'the algorithm compares them'})"
        )
        trainer = {
            "auto": "trainer chosen by timing both in round 1",
            "vectorized": "clients trained vectorized",
            "sequential": f"clients trained one after another ({self.reason})",
        }[self.trainer]
        hook = ", gradient hook after every backward pass" if self.gradient_hook else ""
        spread = f", {self.processes} processes" if self.processes > 1 else ""
        threads = f"; {self.threads} CPU thread{'s' if self.threads != 1 else ''} ({self.threads_from})"
        every = f"; on every client: {'; '.join(self.every_client)}" if self.every_client else ""
        return f"{updates}; {trainer}{hook}{spread}{threads}{every}"

    def as_dict(self) -> dict[str, Any]:
        """The plan's fields as a dict (for summary.json)."""
        return asdict(self)


class ClientExecution:
    """Trains the clients of each round as the plan says, on this process's shard of them."""

    def __init__(
        self,
        algorithm: "Algorithm",
        server: "ServerContext",
        trainer: ClientTrainer,
        config: "FederationConfig",
        collective: Collective,
        threads: tuple[int, str] = (1, ""),
        hold_reason: str | None = None,
        tamper: Callable[[int, list[int], Tensor, Tensor], Tensor] | None = None,
        work: Callable[[int, list[int]], RoundWork] | None = None,
        arrivals: Callable[[int, list[int], Callable[[list[int]], list[Updates]]], Arrivals | None] | None = None,
    ) -> None:
        self.algorithm, self.server, self.trainer = algorithm, server, trainer
        self.config, self.collective = config, collective
        self.holds = algorithm.plan.holds_updates or hold_reason is not None
        self.tamper = tamper  # what clients send of the models they trained (round extensions' `tamper`), or None
        self.work = work  # what the selected clients get done (round extensions' `work`), or None: all of it
        self.arrivals = arrivals  # the updates an asynchronous server aggregates (round extensions'), or None
        self.device = server.device
        plan = algorithm.plan
        own = f"{type(algorithm).__name__} trains its clients itself (train_client)" if plan.own_training else None
        self.plan = ExecutionPlan(
            "hold" if self.holds else "stream",
            "sequential",
            own,
            plan.corrects_gradient,
            collective.world,
            *threads,
            hold_reason=None if plan.holds_updates else hold_reason,
        )
        self.training = GroupTraining(
            trainer,
            server.clients.split("train"),
            server.random.client_seed,
            config,
            collective,
            plan.corrects_gradient,
            own,
            self._follow,
        )
        self.plan.trainer, self.plan.reason = self.training.choice, self.training.reason
        server.clients.bind_group_training(self.train_many)
        server.model.bind_group_gradients(self.training.loss_and_grads)

    def _follow(self, choice: str, reason: str | None) -> None:
        self.plan.trainer, self.plan.reason = choice, reason

    # -- what the trainers hold, for tests and benchmarks ----------------------------------------------------
    @property
    def vectorized(self) -> VectorizedTrainer | None:
        """The vectorized trainer, or None when clients train one after another."""
        return self.training.vectorized

    @vectorized.setter
    def vectorized(self, trainer: VectorizedTrainer | None) -> None:
        self.training.vectorized = trainer

    @property
    def probe_result(self) -> ProbeResult | None:
        """What round 1's probe measured and chose (`vectorize: -1`), or None before it (or without one)."""
        return self.training.probe_result

    def group_size(self, clients: int) -> int:
        """How many of `clients` are trained or aggregated together (`GroupTraining.group_size`)."""
        return self.training.group_size(clients)

    def activation_bytes(self) -> int:
        """What one client's vectorized step keeps for backward (`GroupTraining.activation_bytes`; 0 when clients cannot
        train vectorized)."""
        return self.training.activation_bytes()

    # -- a round ---------------------------------------------------------------------------------------------
    def round_updates(self, round: int, clients: list[int]) -> RoundUpdates:
        """The round's updates, trained when the algorithm asks for them: those of the clients that send one (the
        round extensions' `work` may drop some, left out untrained, and cut others short)."""
        alg = self.algorithm
        work = self.work(round, clients) if self.work is not None else RoundWork()
        dropped = set(work.dropped)
        sending = [c for c in clients if c not in dropped] if dropped else clients
        train = self._training(round, work.shares)
        rate = (
            None
            if alg.plan.own_training
            else self.trainer.learning_rates.round_rate(round, self.local_steps(clients))
            * alg.learning_rate_scale(round)
        )
        arrived = (
            None
            if self.arrivals is None
            else self.arrivals(round, sending, lambda dispatched: [train(group) for group in self._groups(dispatched)])
        )
        if arrived is not None:  # an asynchronous server: the round aggregates the updates that arrived
            sending, train = arrived.clients, arrived.updates
            clients = sorted(set(sending) | dropped)
        groups = self._groups(self.collective.shard(sending))  # every client, unless spread over processes
        return RoundUpdates(
            clients, self.holds, groups, train, self.collective, self.server.num_clients, rate, sorted(dropped)
        )

    def _groups(self, clients: list[int]) -> list[list[int]]:
        """`clients` cut into the groups trained together (one group when the round is held)."""
        if self.holds:
            return [clients]
        size = self.group_size(len(clients))
        return [clients[begin : begin + size] for begin in range(0, len(clients), size)]

    def _training(self, round: int, shares: dict[int, float]) -> Callable[[list[int]], Updates]:
        """`train` of a group of the round's clients, those cut short taking their `shares` of the local steps
        (partial work, `fedlight.training.work_shares`)."""

        def train(group: list[int]) -> Updates:
            with self.trainer.work_shares.during(shares):
                return self.train(round, group)

        return train

    def train(self, round: int, clients: list[int]) -> Updates:
        """Local training of `clients`: the algorithm's `train_group` (the module's SGD by default, vectorized when
        the plan allows; called for one client at a time when clients train one after another, so that a custom
        group loop repeats exactly what it does for one client alone), or its own `train_client` one client after
        another."""
        alg = self.algorithm
        starts = stacked_starts([alg.client_model(c) for c in clients])
        if alg.plan.own_training:
            trained = self._train_own(round, clients, starts)
        elif self.training.choice == "sequential":  # a group of one: a custom loop draws what it drew alone
            trained = self._one_group_each(round, clients, starts)
        else:
            trained = alg.train_group(round, clients, starts)
        message = self.server.message
        message.check_returned(type(alg).__name__, trained.state)
        sent = sum(
            rows[0].numel() * rows.element_size()
            for name, rows in trained.state.items()
            if name in message.entries and len(rows)
        )
        if sent:  # what the message carries beside the trained model (a store's rows alone stay on the client)
            self.server.clients.work.sent(clients, [sent] * len(clients))
        if self.tamper is not None:
            trained.params = self.tamper(round, clients, starts, trained.params)
            for name, trained_from in message.trained_from.items():  # every model entry, extra copies included
                if name in trained.state:
                    trained.state[name] = tampered_rows(
                        self.tamper, round, clients, trained_from(clients), trained.state[name]
                    )
        ids = torch.tensor(clients, device=self.device)
        return Updates(
            ids,
            trained.params,
            starts,
            self.server.clients.aggregation_weights[ids],
            trained.loss,
            trained.logs,
            trained.state,
        )

    def train_many(self, round: int, clients: list[int], starts: Tensor, work: LocalWork) -> Trained:
        """`ServerContext.clients.train_many`: the group training of the plan."""
        return self.training.fit(round, clients, starts, work)

    def _one_group_each(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The algorithm's `train_group` on a group of one client at a time, each trained model written in place
        into one (clients, d) tensor as it arrives, so the models are never held twice nor copied again: a client's
        first training call writes straight into its row (`writing_into`), and a model returned from elsewhere is
        copied in. When the row holds a model the algorithm trained but did not return (a `train_group` of several
        calls, which may keep that model), the row is left alone and the returned models are gathered anew."""
        params = torch.empty_like(starts)
        parts, rows_kept_elsewhere = [], False
        for row in range(len(clients)):
            mine = params[row : row + 1]
            with self.training.writing_into(mine) as lent:
                part = self.algorithm.train_group(round, clients[row : row + 1], starts[row : row + 1])
            if part.params.data_ptr() != mine.data_ptr():  # not written into its row
                if lent.taken:
                    rows_kept_elsewhere = True
                else:
                    mine.copy_(part.params)
                    part.params = mine  # the part's own copy is freed
            parts.append(part)
        return Trained.cat(parts, None if rows_kept_elsewhere else params)

    def _train_own(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The algorithm's own `train_client`, one client after another, written in place (the trained models are
        never held twice)."""
        params, losses = torch.empty_like(starts), torch.empty(len(clients), device=self.device)
        state: dict[str, Tensor] = {}
        for row, (client, start) in enumerate(zip(clients, starts)):
            params[row], losses[row], *extra = self.algorithm.train_client(round, client, start)
            for name, value in (extra[0] if extra else {}).items():
                state.setdefault(name, value.new_empty((len(clients), *value.shape)))[row] = value
        return Trained(params, losses, {}, state)

    def local_steps(self, clients: list[int]) -> int:
        """Local optimizer steps of the longest of `clients` in a round (its batches times the local epochs)."""
        longest = int(self.server.clients.train_sizes[clients].max()) if clients else 0
        return max(1, self.trainer.local_steps(longest))

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any] | None:
        """The probe's result as a dict (None when there was none), so a resumed run keeps the trainer it chose."""
        return self.training.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Keep the checkpoint's probe result when the trainer is still "auto" (`GroupTraining.load_state_dict`)."""
        self.training.load_state_dict(state)
