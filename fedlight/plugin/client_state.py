"""Per-client state the engine keeps for an algorithm (docs/architecture.md, "Client state"): what an algorithm sees
of it. The stores themselves (memory budget, spill file, checkpoints) are the engine's
(`fedlight.engine.client_states`).

An algorithm declares each per-client tensor once in `setup`, and reads and writes rows of it:

    self.personal_models = server.state.declare("personal", initial=server.model.initial_params)
    rows = self.personal_models.read(clients)   # (len(clients), *row_shape) on the server's device
    self.personal_models.write(clients, rows)   # the same rows on every process

A client never written reads `initial` (a tensor of the row shape, or a callable `initial(clients) -> rows`). Rows
live in memory up to `federation.client_state_memory`, beyond it in a file of the run folder, and are checkpointed.
What the clients' local work returns under a store's name (`train_group`'s `Trained.state`, an own
`train_client`'s third element) is written by the engine after `post_aggregation`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

Clients = Sequence[int] | Tensor
Initial = Tensor | Callable[[Tensor], Tensor]


@runtime_checkable
class ClientState(Protocol):
    """One named per-client tensor: rows of shape `row_shape` and dtype `dtype` (`row_bytes` each) for clients
    0..num_clients-1, on `device`."""

    name: str
    num_clients: int
    row_shape: tuple[int, ...]
    dtype: torch.dtype
    row_bytes: int
    device: torch.device

    def read(self, clients: Clients) -> Tensor:
        """(len(clients), *row_shape) the clients' rows, a copy: clients never written read `initial`."""
        ...

    def __getitem__(self, client: int) -> Tensor:
        """One client's row (a copy)."""
        ...

    def write(self, clients: Clients, rows: Tensor) -> None:
        """Store `rows` (len(clients), *row_shape) as the clients' rows (every process writes the same rows)."""
        ...

    def touched(self) -> Tensor:
        """The clients with a stored row, sorted."""
        ...


class ClientStateStores(Protocol):
    """A federation's stores as the server context declares and drops them (the engine's `ClientStates`)."""

    @property
    def stores(self) -> Mapping[str, ClientState]:
        """The declared stores by name."""
        ...

    def declare(self, name: str, num_clients: int, initial: Initial) -> ClientState:
        """A new store named `name` of `num_clients` rows, reading `initial` until written."""
        ...

    def drop(self, name: str) -> ClientState:
        """Remove the store `name` and return it (to declare its successor under the same name)."""
        ...
