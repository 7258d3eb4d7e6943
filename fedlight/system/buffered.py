"""Asynchronous buffered aggregation, FedBuff (Nguyen et al., "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS 2022, Algorithm 1), on the virtual clock.

C clients (`system.concurrency`) train at once; the server updates its models every K arrivals (`system.buffer_size`;
a fedlight round is one update) and then dispatches as many new clients as arrived, so C stay in flight.

Where this differs from Algorithm 1, stated rather than built: the paper's server samples a replacement as each
client arrives, so the K - 1 slots an update's earlier arrivals free start again at once, from the model of that
moment (the one before the update); here all K replacements start at the update, from the updated model, and those
slots idle in between. Refilling at each arrival would need each client's start model as it was before the update,
which a clustered or personalized method's `client_model` cannot give for a client it has not yet selected. The
wall-clock cost shows on the virtual clock (`system/round_virtual_s`); the paper's server learning rate eta_g is
`server_optimizer: {kind: sgd, lr: eta_g}` beside the buffer (tests/unit/test_system_fedbuff.py checks the step). A
dispatched client trains at once from the model it receives (training is deterministic, so training it then equals
training it later); its change (trained minus the model it received) waits here, C rows at most, until its arrival
on the virtual clock: its dispatch time plus its local work and transfers (`fedlight.system.clock`).

A round aggregates the K earliest arrivals. An update trained from version v arrives at version V, staleness
tau = V - v, weighted s(tau) = 1 / sqrt(1 + tau) (the paper's polynomial choice) or 1. It is handed to the algorithm
re-based on the model the client would receive now: start = `client_model(c)`, params = start + s(tau) x change, so
every algorithm's own `aggregate` (a weighted mean, FedProx's, per-cluster means) applies unchanged. An update that
arrives in the round it was dispatched in (tau = 0) is handed exactly as trained, so K = C = the cohort is
synchronous FedAvg bit for bit.

Staleness is of the model a client trained from, entry by entry, never declared: an entry of `client_model(c)` that
has not moved since the client was sent out (its personal part, which only its own arrival writes: a personal head,
BatchNorm layers; a model only it writes: Local's, FedSoft's local models; a cluster model no other arrival changed)
arrives exactly as trained, nothing having moved under it; an entry that moved is re-based with the weight. So an
algorithm whose per-client state is the trained models themselves gets them as trained, and a personal-part method
its personal entries as trained and its shared ones re-based, with nothing to say about it. An algorithm that starts
a client from a model others change while it is in flight (FedAMP's and FedFomo's combinations of other clients'
models, FLIS-DC's pool model) gets its change re-based on that model as it is now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.updates import Updates


def staleness_weight(tau: np.ndarray, kind: str) -> np.ndarray:
    """s(tau) of each staleness: 1 / sqrt(1 + tau) ("polynomial", FedBuff's a = 1/2), or 1 ("constant")."""
    tau = np.asarray(tau, dtype=float)
    return 1.0 / np.sqrt(1.0 + tau) if kind == "polynomial" else np.ones_like(tau)


def rebased(start: Tensor, change: Tensor, weight: float) -> Tensor:
    """The update a client would send from `start` now: start + weight x change."""
    return start + weight * change


@dataclass
class InFlight:
    """Clients training now, one row each: the model each trained and the one it received (its change is their
    difference), the server version it received, its arrival time on the virtual clock, and what it reported (loss,
    logs, state: what the engine stores at its arrival)."""

    clients: np.ndarray
    versions: np.ndarray
    arrivals_s: np.ndarray
    trained: Tensor
    starts: Tensor
    losses: Tensor
    logs: dict[str, Tensor] = field(default_factory=dict)
    state: dict[str, Tensor] = field(default_factory=dict)
    entry_starts: dict[str, Tensor] = field(default_factory=dict)  # the models each model entry was trained from

    @classmethod
    def empty(cls, like: Tensor) -> "InFlight":
        return cls(
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            np.zeros(0),
            like.new_zeros(0, len(like)),
            like.new_zeros(0, len(like)),
            like.new_zeros(0),
        )

    @classmethod
    def of(
        cls, updates: Updates, version: int, arrivals_s: np.ndarray, entry_starts: dict[str, Tensor] | None = None
    ) -> "InFlight":
        """Freshly trained `updates`, dispatched at `version`, arriving at `arrivals_s`; `entry_starts`: the models
        each of their model entries was trained from."""
        return cls(
            updates.clients.cpu().numpy().astype(np.int64),
            np.full(len(updates), version, dtype=np.int64),
            np.asarray(arrivals_s, dtype=float),
            updates.params,
            updates.starts,
            updates.train_loss,
            dict(updates.logs),
            dict(updates.state),
            dict(entry_starts or {}),
        )

    def __len__(self) -> int:
        return len(self.clients)

    def subset(self, rows: np.ndarray) -> "InFlight":
        """The rows `rows` alone, in that order."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.trained.device)
        return InFlight(
            self.clients[rows],
            self.versions[rows],
            self.arrivals_s[rows],
            self.trained[index],
            self.starts[index],
            self.losses[index],
            {k: v[index] for k, v in self.logs.items()},
            {k: v[index] for k, v in self.state.items()},
            {k: v[index] for k, v in self.entry_starts.items()},
        )

    def cat(self, other: "InFlight") -> "InFlight":
        """These rows followed by `other`'s (either alone when the other is empty)."""
        if not len(self):
            return other
        if not len(other):
            return self
        return InFlight(
            np.concatenate([self.clients, other.clients]),
            np.concatenate([self.versions, other.versions]),
            np.concatenate([self.arrivals_s, other.arrivals_s]),
            torch.cat([self.trained, other.trained]),
            torch.cat([self.starts, other.starts]),
            torch.cat([self.losses, other.losses]),
            {k: torch.cat([v, other.logs[k]]) for k, v in self.logs.items()},
            {k: torch.cat([v, other.state[k]]) for k, v in self.state.items()},
            {k: torch.cat([v, other.entry_starts[k]]) for k, v in self.entry_starts.items()},
        )

    def state_dict(self) -> dict[str, Any]:
        """Tensors only, on the CPU (a checkpoint is read with `torch.load(weights_only=True)`)."""
        return {
            "clients": torch.from_numpy(self.clients),
            "versions": torch.from_numpy(self.versions),
            "arrivals_s": torch.from_numpy(self.arrivals_s),
            "trained": self.trained.cpu(),
            "starts": self.starts.cpu(),
            "losses": self.losses.cpu(),
            "logs": {k: v.cpu() for k, v in self.logs.items()},
            "state": {k: v.cpu() for k, v in self.state.items()},
            "entry_starts": {k: v.cpu() for k, v in self.entry_starts.items()},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], device: torch.device) -> "InFlight":
        if "trained" not in state:
            raise ValueError(
                "the checkpoint's FedBuff buffer holds only its clients' changes (it predates the "
                "trained models kept in flight): start the run again"
            )
        return cls(
            state["clients"].numpy(),
            state["versions"].numpy(),
            state["arrivals_s"].numpy(),
            state["trained"].to(device),
            state["starts"].to(device),
            state["losses"].to(device),
            {k: v.to(device) for k, v in state["logs"].items()},
            {k: v.to(device) for k, v in state["state"].items()},
            {k: v.to(device) for k, v in state.get("entry_starts", {}).items()},
        )


def arrival_order(arrivals_s: np.ndarray, versions: np.ndarray, clients: np.ndarray) -> np.ndarray:
    """Rows by arrival time; ties by the version received (the earlier dispatch first), then by client."""
    return np.lexsort((clients, versions, arrivals_s))


@dataclass
class Arrived:
    """A round's arrivals, rows sorted by client: what they send (`params` re-based), their staleness, and their
    latest arrival time."""

    updates: Updates
    staleness: np.ndarray
    last_s: float

    def group(self, clients: list[int]) -> Updates:
        """The updates of `clients` (some of the arrived ones), rows in their order."""
        position = {int(c): i for i, c in enumerate(self.updates.clients.tolist())}
        return self.updates.subset(
            torch.tensor([position[c] for c in clients], dtype=torch.long, device=self.updates.params.device)
        )


def take_arrivals(
    waiting: InFlight,
    fresh: Updates | None,
    fresh_arrivals_s: np.ndarray,
    version: int,
    count: int,
    staleness: str,
    client_model: Callable[[int], Tensor],
    sizes: Tensor,
    trained_from: dict[str, Callable[[list[int]], Tensor]] | None = None,
) -> tuple[Arrived, InFlight]:
    """The `count` earliest arrivals among the clients `waiting` and the `fresh` ones just trained from `version`
    (arriving at `fresh_arrivals_s`), and the clients still in flight after them. A fresh arrival (staleness 0) sends
    its trained model as trained; a waiting one its change re-based on `client_model(c)` with weight s(tau) on the
    entries that moved since it was sent out, as trained on the others, and so each model entry the algorithm says
    the origin of (`trained_from`: `MessageSchema.trained_from`) on the models it would be trained from now.
    `sizes`: (clients,) training-set sizes."""
    trained_from = trained_from or {}
    fresh_flight = None
    if fresh is not None and len(fresh):
        clients = fresh.clients.tolist()
        entry_starts = {name: start_of(clients) for name, start_of in trained_from.items() if name in fresh.state}
        fresh_flight = InFlight.of(fresh, version, fresh_arrivals_s, entry_starts)
    every = waiting if fresh_flight is None else waiting.cat(fresh_flight)
    order = arrival_order(every.arrivals_s, every.versions, every.clients)
    come, stay = np.sort(order[:count]), np.sort(order[count:])
    taken = every.subset(come)
    tau = version - taken.versions
    is_fresh, weights = come >= len(waiting), staleness_weight(tau, staleness)
    starts, params = rebased_updates(taken, is_fresh, weights, client_model)
    for name, then in taken.entry_starts.items():
        now = trained_from[name](taken.clients.tolist()) if len(taken) else then
        taken.state[name] = rebased_entry(taken.state[name], then, now, is_fresh, weights)
    by_client = np.argsort(taken.clients, kind="stable")
    index = torch.as_tensor(by_client, dtype=torch.long, device=params.device)
    ids = torch.as_tensor(taken.clients[by_client], dtype=torch.long, device=params.device)
    updates = Updates(
        ids,
        params[index],
        starts[index],
        sizes[ids],
        taken.losses[index],
        {k: v[index] for k, v in taken.logs.items()},
        {k: v[index] for k, v in taken.state.items()},
    )
    last_s = float(taken.arrivals_s.max()) if len(taken) else float("nan")
    return Arrived(updates, tau[by_client], last_s), every.subset(stay)


def rebased_entry(trained: Tensor, then: Tensor, now: Tensor, fresh: np.ndarray, weights: np.ndarray) -> Tensor:
    """A model entry's rows (clients, ..., d) trained from `then`, as FedBuff hands them: fresh rows as trained, a
    stale row re-based on `now` (the models it would be trained from at its arrival) with its weight where they
    moved, as trained where they did not."""
    out = trained.clone()
    for row, (is_fresh, weight) in enumerate(zip(fresh, weights)):
        if not is_fresh:
            moved = rebased(now[row], trained[row] - then[row], float(weight))
            out[row] = torch.where(now[row] == then[row], trained[row], moved)
    return out


def rebased_updates(
    taken: InFlight, fresh: np.ndarray, weights: np.ndarray, client_model: Callable[[int], Tensor]
) -> tuple[Tensor, Tensor]:
    """(starts, params) of the arrivals `taken` as FedBuff hands them: each from the model it would receive now,
    `client_model(c)`; a `fresh` one (trained this round, from that model) exactly as trained, a stale one moved by
    its weight times its change on the entries of that model that moved since it was sent out, and exactly as
    trained on the others (nothing moved under them: its own personal part, a model only it writes)."""
    starts = torch.stack([client_model(int(c)) for c in taken.clients]) if len(taken) else taken.starts.clone()
    return starts, rebased_entry(taken.trained, taken.starts, starts, fresh, weights)
