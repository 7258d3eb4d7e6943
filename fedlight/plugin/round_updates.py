"""`RoundUpdates`: a round's updates as a value the aggregation hooks ask for (see `fedlight.plugin.updates`).

It trains lazily: a streamed round trains each group when `groups()` reaches it, a held round trains everything at
the first `all()`. `finish()` (called by the engine after `post_aggregation`) trains whatever no hook asked for,
and returns the round's training report, shared over the processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.training_stats import Processes, TrainingStats, gather_logs
from fedlight.plugin.updates import Updates


class OneProcess:
    """`Processes` of a run on one process: to call the aggregation hooks directly (tests, `RoundUpdates.of`)."""

    world, rank, spread, device = 1, 0, False, torch.device("cpu")

    def sum_(self, tensor: Tensor) -> Tensor:
        """`tensor` itself: the sum over one process."""
        return tensor

    def gather(self, tensor: Tensor) -> Tensor:
        """`tensor` itself: one process's rows."""
        return tensor

    def gather_objects(self, obj: Any) -> list[Any]:
        """`[obj]`: one process's object."""
        return [obj]


@dataclass
class TrainingReport:
    """What a round's local training reports: the clients left out (non-finite update, loss or state, and the
    `dropped`: those that sent nothing), the scalars (`train/loss`, `train/<logged name>`, `train/lr`) and each
    client's values (`train/<name>`)."""

    left_out: list[int]
    metrics: dict[str, float]
    per_client: dict[str, np.ndarray]
    dropped: list[int] = field(default_factory=list)


CHECK_ENTRIES = 1 << 24  # entries checked for finiteness at a time (16 MB of booleans)


def finite_rows(values: Tensor) -> Tensor:
    """(m,) whether every entry of each of the m rows of `values` is finite. First one sum a row (one read of the
    rows, about 20x faster than `isfinite` on a CPU): a NaN or an infinity in a row makes its sum non-finite, so
    finite sums settle it. Otherwise (a non-finite entry, or finite entries whose sum overflows) entry by entry, a
    block of rows at a time (a boolean copy of every model would cost a quarter of them)."""
    rows = values.flatten(1) if values.dim() > 1 else values[:, None]
    if rows.is_floating_point() and bool(torch.isfinite(rows.sum(dim=1)).all()):
        return torch.ones(len(rows), dtype=torch.bool, device=rows.device)  # a sum is finite only if every entry is
    step = max(1, CHECK_ENTRIES // max(1, rows.shape[1]))
    blocks = [torch.isfinite(rows[begin : begin + step]).all(dim=1) for begin in range(0, len(rows), step)]
    return torch.cat([rows.new_zeros(0, dtype=torch.bool), *blocks])


def finite(updates: Updates, left_out: list[int]) -> Updates:
    """The updates whose trained model, training loss and every row of state they returned (`Updates.state`) are
    finite; the clients of the others are appended to `left_out` (a NaN in a client's data or an exploding loss must
    not poison a cluster's average, nor be stored as the client's state)."""
    keep = finite_rows(updates.params) & torch.isfinite(updates.train_loss)
    for rows in updates.state.values():
        keep &= finite_rows(rows).to(keep.device)
    if bool(keep.all()):
        return updates
    left_out.extend(updates.clients[~keep].tolist())
    return updates.subset(keep)


class RoundUpdates:
    """The updates of one round. `clients` are the round's selected clients (of every process); `holds` is the
    algorithm's plan: True, `all()` gives every update at once; False, `groups()` streams them.

    Args:
        clients: the selected clients, in the order `all()` returns them.
        holds: the plan (`Plan.holds_updates`).
        groups: this process's clients, cut into the groups it trains together.
        train: trains a list of clients and returns their updates.
        collective: the federation's processes.
        num_clients: clients in the federation.
        learning_rate: the round's learning rate to log (None when the algorithm's clients do not run SGD).
        dropped: selected clients that send nothing (`fedlight.plugin.round_work.RoundWork`: offline, dropped out,
            past a deadline), in no group: left out from the start, on the first process (every process is given
            them all).
    """

    def __init__(
        self,
        clients: list[int],
        holds: bool,
        groups: list[list[int]],
        train: Callable[[list[int]], Updates],
        collective: Processes,
        num_clients: int,
        learning_rate: float | None = None,
        dropped: list[int] | None = None,
    ) -> None:
        self.clients, self.holds = clients, holds
        self._groups, self._train, self._collective = groups, train, collective
        self._num_clients, self._learning_rate = num_clients, learning_rate
        self._stats = TrainingStats(num_clients)
        self.dropped = sorted(dropped or [])
        self._left_out: list[int] = list(self.dropped) if collective.rank == 0 else []
        self._all: Updates | None = None
        self._streamed = False
        self._sent: list[tuple[Tensor, dict[str, Tensor]]] = []  # streamed groups' Updates.state, kept for state()
        self._released = False  # `release` dropped what the round held

    @classmethod
    def of(cls, updates: Updates) -> "RoundUpdates":
        """A held round made of given updates on one process: to call the aggregation hooks directly (tests, an
        algorithm that runs another's hooks)."""
        clients = updates.clients.tolist()
        return cls(clients, True, [clients], lambda _: updates, OneProcess(), int(max(clients, default=-1)) + 1)

    @property
    def left_out(self) -> list[int]:
        """Clients left out of aggregation (non-finite model, loss or returned state, and the `dropped`, which sent
        nothing): held, every one of the round; streamed, this process's so far (complete once `groups()` has run
        through)."""
        if self.holds:
            self.all()
        return self._left_out

    @property
    def nothing_received(self) -> bool:
        """Whether a held round was trained and left every selected client that sent something out: its hooks got no
        update at all (a streamed round's groups may each be empty, which running sums take in their stride)."""
        return self.holds and self._all is not None and len(self._all) == 0 and len(self.clients) > len(self.dropped)

    # -- streamed ----------------------------------------------------------------------------------------------
    def groups(self) -> Iterator[Updates]:
        """This process's finite updates a group at a time, each trained when reached (held: the one group of
        every update). A streamed round can be run through once."""
        if self.holds:
            yield self.all()
            return
        if self._streamed:
            raise RuntimeError(
                "a streamed round's updates can be read once (its groups are trained as they are "
                "read): declare plan = Plan(holds_updates=True) on the algorithm to look at them "
                "more than once"
            )
        self._streamed = True
        for group in self._groups:
            updates = self._stats.add(finite(self._train(group), self._left_out))
            if updates.state:
                self._sent.append((updates.clients, updates.state))
            yield updates
            del updates  # or it would stay alive while the next group trains: two groups in memory

    def sum_over_processes_(self, *tensors: Tensor) -> None:
        """Add each tensor over the processes in place (streamed sums of every process's groups; held: nothing to
        do, every process has every update)."""
        if not self.holds:
            for tensor in tensors:
                self._collective.sum_(tensor)

    def cat_over_processes(self, tensor: Tensor) -> Tensor:
        """Every process's rows of `tensor`, concatenated in rank order (held: `tensor` itself)."""
        return tensor if self.holds else self._collective.gather(tensor)

    def state(self, name: str) -> tuple[Tensor, Tensor]:
        """(clients, rows): what the round's clients sent as `name` beside their models (the third element of an
        algorithm's own `train_client`, `Updates.state`), every process's, so every process stores the same
        per-client state. Streamed, it covers the groups `groups()` has run through (call it after them)."""
        if self.holds:
            return self.all().clients, self.all().state[name]
        parts = [(clients, state[name]) for clients, state in self._sent]
        like = parts[0][1] if parts else None
        if self._collective.spread:  # every process asks; one that trained nobody sends rows of the others' shape
            shapes = self._collective.gather_objects(None if like is None else like[:0].cpu())
            if like is None:
                like = next(t for t in shapes if t is not None).to(self._collective.device)
        if like is None:
            raise RuntimeError(f"no client sent {name!r} this round: call state() after groups() has run through")
        clients = torch.cat([like.new_zeros(0, dtype=torch.long), *(c for c, _ in parts)])
        rows = torch.cat([like[:0], *(r for _, r in parts)])
        return self._collective.gather(clients), self._collective.gather(rows)

    def state_names(self) -> list[str]:
        """The names the round's clients sent state under (`Updates.state`), any process's. Streamed, it covers the
        groups `groups()` has run through."""
        if self.holds:
            return sorted(self.all().state)
        mine = {name for _, state in self._sent for name in state}
        return sorted(set().union(*self._collective.gather_objects(mine)))

    # -- held --------------------------------------------------------------------------------------------------
    def all(self) -> Updates:
        """Every finite update of the round, in the order of `clients`, on every process."""
        if not self.holds:
            raise RuntimeError(
                "this algorithm streams its updates (holds_updates = False), so the round is never held "
                "whole: iterate groups(), or declare plan = Plan(holds_updates=True) to receive "
                "every update at once"
            )
        if self._released:
            raise RuntimeError("the round's updates were released after the round: read them in its hooks")
        if self._all is None:
            mine = [c for group in self._groups for c in group]
            updates = finite(self._train(mine), self._left_out)
            self._all = self._stats.add(self._gather(updates))
            self._left_out = sorted(c for part in self._collective.gather_objects(self._left_out) for c in part)
        return self._all

    def _gather(self, updates: Updates) -> Updates:
        """Every process's updates, in the order of `clients` (the single-process order)."""
        collective = self._collective
        if not collective.spread:
            return updates
        device = updates.params.device
        position = torch.full((self._num_clients,), -1, dtype=torch.long, device=device)
        position[torch.tensor(self.clients, device=device)] = torch.arange(len(self.clients), device=device)
        ids = collective.gather(updates.clients)
        params, starts, num_samples, train_loss = [
            collective.gather(t) for t in (updates.params, updates.starts, updates.num_samples, updates.train_loss)
        ]
        logs = gather_logs(collective, updates.logs, len(updates), device)
        state = {k: collective.gather(v) for k, v in sorted(updates.state.items())}  # every process has the same names
        order = position[ids].argsort()
        return Updates(
            ids[order],
            params[order],
            starts[order],
            num_samples[order],
            train_loss[order],
            {k: v[order] for k, v in logs.items()},
            {k: v[order] for k, v in state.items()},
        )

    def release(self) -> None:
        """Drop what the round held (the held updates, the streamed groups' returned entries) once the engine has
        stored it, so that the evaluation after the round does not keep a round of models alive."""
        self._all, self._sent, self._groups, self._released = None, [], [], True

    # -- the engine's ------------------------------------------------------------------------------------------
    def finish(self) -> TrainingReport:
        """Train what no hook asked for, and report the round's training over every process."""
        if self.holds:
            self.all()
        else:
            if not self._streamed:
                for _ in self.groups():
                    pass
            self._stats.share(self._collective)
            self._left_out = sorted(c for part in self._collective.gather_objects(self._left_out) for c in part)
        metrics = self._stats.metrics()
        if self._learning_rate is not None:
            metrics["train/lr"] = self._learning_rate
        return TrainingReport(self._left_out, metrics, self._stats.per_client(), self.dropped)
