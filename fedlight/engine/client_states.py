"""The client-state stores the engine keeps for algorithms (the API: `fedlight.plugin.client_state`).

Rows of a client never written are its store's `initial`, of which no per-client copy is kept: memory grows with
the clients written and is bounded by a byte budget (`federation.client_state_memory`), shared by the run's stores.
Rows beyond the budget go to a memory-mapped file, one per store and process, in the run folder's `client_state/`
(`fedlight.engine.spill`; a federation built without the runner uses a temporary folder, removed at exit). A row
stays where it was first stored.

When the clients' local work returns rows under a store's name (`train_group`'s `Trained.state`, or an own
`train_client`'s third element, reaching `Updates.state`), the engine writes the round's rows, gathered over the
processes, after `post_aggregation` (`ClientStates.write_returned`); a client whose model, loss or any returned row
is not finite is left out of the round and none of its rows is written.

Checkpoints: every store is saved in the federation's state (`ClientStates.state_dict`): the rows in memory
themselves, and for the rows in the file only their slots, so a checkpoint stays small however many rows spilled.
A slot a kept checkpoint may refer to is never overwritten: the runner reports each checkpoint it takes
(`checkpointed`), rows written since the last one are rewritten in place, others go to another slot and their old
slot is reused only once two newer checkpoints exist (`fedlight.engine.spill`). A run resumed from either kept
checkpoint, even after a crash that wrote the next round's rows, then reads exactly the rows it saved.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlight.engine.spill import SpillFile
from fedlight.plugin.client_state import Clients, Initial

if TYPE_CHECKING:
    from fedlight.plugin.round_updates import RoundUpdates

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


class MemoryBudget:
    """Bytes of rows in memory, shared by a federation's stores: a row is kept in memory while it fits."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, size: int) -> bool:
        """Reserve `size` bytes if they fit."""
        if size and self.used + size > self.limit:
            return False
        self.used += size
        return True


class ClientStateStore:
    """One named per-client tensor (it meets `fedlight.plugin.client_state.ClientState`): rows of shape
    `row_shape` and dtype `dtype`, for clients 0..num_clients-1.

    Args:
        name: the store's name (the key an algorithm's local work returns its rows under).
        num_clients: clients in the federation.
        initial: what a client never written reads: a tensor of the row shape, or a callable taking a long tensor
            of clients and returning their rows (called once with client 0 to learn the row's shape and dtype).
        device: where rows are read to and kept in memory.
        budget: the federation's memory budget.
        spill_path: the file rows beyond the budget go to (called when the first row spills).
    """

    def __init__(
        self,
        name: str,
        num_clients: int,
        initial: Initial,
        device: torch.device,
        budget: MemoryBudget,
        spill_path: Callable[[], Path],
    ) -> None:
        self.name, self.num_clients, self.device, self._budget = name, num_clients, torch.device(device), budget
        self._initial: Tensor | None = None
        self._initial_of: Callable[[Tensor], Tensor] | None = None
        if isinstance(initial, Tensor):
            self._initial = initial.to(self.device)
            self.row_shape, self.dtype = tuple(initial.shape), initial.dtype
        elif callable(initial):
            self._initial_of = initial
            example = torch.as_tensor(initial(torch.zeros(1, dtype=torch.long, device=self.device)))
            self.row_shape, self.dtype = tuple(example.shape[1:]), example.dtype
        else:
            raise TypeError(
                f"client state {name!r}: initial must be a tensor of the row shape or a callable "
                f"initial(clients) -> rows, got {type(initial).__name__}"
            )
        self.row_bytes = torch.Size(self.row_shape).numel() * torch.empty((), dtype=self.dtype).element_size()
        self._memory: dict[int, Tensor] = {}  # client -> its row, in memory
        self._slot: dict[int, int] = {}  # client -> its slot in the spill file
        self._file = SpillFile(spill_path, self.row_bytes)

    # -- reading -----------------------------------------------------------------------------------------------
    def read(self, clients: Clients) -> Tensor:
        """(len(clients), *row_shape) the clients' rows on the device, a copy: untouched clients read `initial`,
        spilled rows are read from the file."""
        ids = self._ids(clients)
        kinds: dict[str, tuple[list[int], list[int]]] = {"initial": ([], []), "memory": ([], []), "file": ([], [])}
        for position, client in enumerate(ids):
            kind = "memory" if client in self._memory else "file" if client in self._slot else "initial"
            kinds[kind][0].append(position)
            kinds[kind][1].append(client)
        if ids and len(ids) in (len(kinds["memory"][1]), len(kinds["file"][1])):  # one kind: no second copy
            return self._rows("memory" if kinds["memory"][1] else "file", ids)
        out = torch.empty((len(ids), *self.row_shape), dtype=self.dtype, device=self.device)
        for kind, (positions, members) in kinds.items():
            if members:
                out[torch.tensor(positions, device=self.device)] = self._rows(kind, members)
        return out

    def __getitem__(self, client: int) -> Tensor:
        """One client's row (a copy)."""
        return self.read([int(client)])[0]

    def _rows(self, kind: str, clients: list[int]) -> Tensor:
        if kind == "memory":
            return torch.stack([self._memory[c] for c in clients])
        if kind == "file":
            raw = self._file.read([self._slot[c] for c in clients])
            return raw.view(self.dtype).reshape(len(clients), *self.row_shape).to(self.device)
        if self._initial is not None:
            return self._initial
        assert self._initial_of is not None  # `initial` was a tensor or a callable
        return self._initial_of(torch.tensor(clients, dtype=torch.long, device=self.device))

    # -- writing -----------------------------------------------------------------------------------------------
    def write(self, clients: Clients, rows: Tensor) -> None:
        """Store `rows` (len(clients), *row_shape) as the clients' rows: in memory while the budget allows, else
        in the spill file. Every process must write the same rows (as the engine's gathered updates are)."""
        ids = self._ids(clients)
        if tuple(rows.shape) != (len(ids), *self.row_shape):
            raise ValueError(
                f"client state {self.name!r}: write got rows of shape {tuple(rows.shape)} for {len(ids)} "
                f"clients; give one row of shape {self.row_shape} per client"
            )
        rows = rows.detach()
        spilled: list[tuple[int, int]] = []  # (row, slot)
        for row, client in enumerate(ids):
            if client in self._memory:
                self._memory[client].copy_(rows[row])
            elif client not in self._slot and self._budget.take(self.row_bytes):
                self._memory[client] = rows[row].to(device=self.device, dtype=self.dtype, copy=True)
            else:
                self._slot[client] = slot = self._file.place(self._slot.get(client))
                spilled.append((row, slot))
        if spilled:
            index = torch.tensor([row for row, _ in spilled], device=rows.device)
            data = rows[index].to(device="cpu", dtype=self.dtype).reshape(len(spilled), -1).contiguous()
            self._file.write([slot for _, slot in spilled], data.view(torch.uint8).reshape(len(spilled), -1))

    def _ids(self, clients: Clients) -> list[int]:
        ids = clients.tolist() if isinstance(clients, Tensor) else [int(c) for c in clients]
        bad = [c for c in ids if not 0 <= c < self.num_clients]
        if bad:
            raise IndexError(
                f"client state {self.name!r}: clients {bad[:5]} are not among the {self.num_clients} "
                "clients (0 to num_clients - 1)"
            )
        return ids

    # -- what is stored ----------------------------------------------------------------------------------------
    def touched(self) -> Tensor:
        """The clients with a stored row, sorted, on the device."""
        return torch.tensor(sorted([*self._memory, *self._slot]), dtype=torch.long, device=self.device)

    @property
    def memory_bytes(self) -> int:
        """Bytes of the rows kept in memory."""
        return len(self._memory) * self.row_bytes

    @property
    def spilled_rows(self) -> int:
        """Rows kept in the spill file."""
        return len(self._slot)

    @property
    def stored_bytes(self) -> int:
        """Bytes of every stored row, in memory and in the file."""
        return self.memory_bytes + self.spilled_rows * self.row_bytes

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The rows in memory, and the slots of the rows in the file (not the rows: the file keeps them)."""
        memory = sorted(self._memory)
        spilled = sorted(self._slot)
        return {
            "row_shape": list(self.row_shape),
            "memory_clients": torch.tensor(memory, dtype=torch.long),
            "memory_rows": [self._memory[c] for c in memory],
            "file_clients": torch.tensor(spilled, dtype=torch.long),
            "file_slots": torch.tensor([self._slot[c] for c in spilled], dtype=torch.long),
            "file": self._file.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rows of `state_dict`: the rows in memory are copied in (over the budget if it is smaller now),
        the rows in the file are read from it when asked for."""
        if list(state["row_shape"]) != list(self.row_shape):
            raise ValueError(
                f"client state {self.name!r}: the checkpoint's rows have shape "
                f"{tuple(state['row_shape'])}, the algorithm declares {self.row_shape}: resume with the "
                "model and algorithm of the run"
            )
        self._budget.used -= self.memory_bytes
        self._memory = {
            int(c): row.to(device=self.device, dtype=self.dtype, copy=True)
            for c, row in zip(state["memory_clients"].tolist(), state["memory_rows"])
        }
        self._budget.used += self.memory_bytes
        self._slot = dict(zip(state["file_clients"].tolist(), state["file_slots"].tolist()))
        self._file.load_state_dict(state["file"], list(self._slot.values()), self.name)

    def checkpointed(self) -> None:
        """A checkpoint was taken: tell the spill file (`SpillFile.checkpointed`), which then keeps the rows it refers
        to."""
        self._file.checkpointed()

    def relocate(self, spill_path: Callable[[], Path]) -> None:
        """Keep the spill file where `spill_path()` names (`SpillFile.relocate`), before any row spills."""
        self._file.relocate(spill_path)


def memory_rows_state(clients: Tensor, rows: Tensor) -> dict[str, Any]:
    """The checkpoint state (`ClientStateStore.state_dict`'s form) of a store holding `rows` of `clients` in memory and
    nothing in its file: for a checkpoint upgrade that moves rows an older format kept elsewhere into a store."""
    empty = torch.zeros(0, dtype=torch.long)
    return {
        "row_shape": list(rows.shape[1:]),
        "memory_clients": clients.to(torch.long),
        "memory_rows": list(rows),
        "file_clients": empty,
        "file_slots": empty,
        "file": {"next_slot": 0, "free": empty, "pending": empty.reshape(0, 2), "checkpoints": 0},
    }


class ClientStates:
    """A federation's stores, their shared memory budget and the folder of their spill files.

    Args:
        device: where rows are read to and kept in memory.
        memory_limit: bytes of rows kept in memory over all stores (`fedlight.engine.devices.client_state_budget`).
        rank: this process's rank (each process keeps its own spill files).
    """

    FILE_SUFFIX = ".rows"

    def __init__(self, device: torch.device, memory_limit: int, rank: int = 0) -> None:
        self.device, self.rank = device, rank
        self.budget = MemoryBudget(memory_limit)
        self.stores: dict[str, ClientStateStore] = {}
        self._folder: Path | None = None  # None: a temporary folder, made when a row first spills

    def declare(self, name: str, num_clients: int, initial: Initial) -> ClientStateStore:
        """A new store named `name` (letters, digits, `_`, `.`, `-`; one store per name)."""
        if not NAME.fullmatch(name):
            raise ValueError(f"client state name {name!r}: use letters, digits, '_', '.' and '-' (it names a file)")
        if name in self.stores:
            raise ValueError(f"client state {name!r} is declared twice: give each per-client tensor its own name")
        store = ClientStateStore(name, num_clients, initial, self.device, self.budget, self._spill_path(name))
        self.stores[name] = store
        return store

    def drop(self, name: str) -> ClientStateStore:
        """Remove the store `name` (to declare its successor, as a change of `Algorithm.set_personal_mask` does):
        its rows in memory leave the budget, it stays readable until let go, and its spill file stays (a kept
        checkpoint may still refer to it)."""
        if name not in self.stores:
            raise KeyError(
                f"client state {name!r} is not declared (declared: {sorted(self.stores)}): drop a declared store"
            )
        store = self.stores.pop(name)
        self.budget.used -= store.memory_bytes
        return store

    @property
    def folder(self) -> Path:
        """Where the spill files are: the run folder's `client_state/`, or a temporary folder removed at exit."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="fedlight-client-state-"))
            weakref.finalize(self, shutil.rmtree, self._folder, True)
        return self._folder

    @property
    def spill_location(self) -> Path:
        """The folder the spill files are or will be in, without making it: the chosen one, or else the system's
        temporary folder, in which the first spill makes the run's own (`folder`)."""
        return self._folder if self._folder is not None else Path(tempfile.gettempdir())

    def spill_files(self) -> list[Path]:
        """This process's spill files that exist now (one per store that has spilled, or that a resumed run's
        folder holds)."""
        if self._folder is None:
            return []
        return [path for path in (self._spill_path(name)() for name in self.stores) if path.is_file()]

    def use_folder(self, folder: Path) -> None:
        """Keep the spill files in `folder` (the runner's `<run folder>/client_state`), before any row spills."""
        self._folder = Path(folder)
        for name, store in self.stores.items():
            store.relocate(self._spill_path(name))

    def _spill_path(self, name: str) -> Callable[[], Path]:
        return lambda: self.folder / f"{name}.{self.rank}{self.FILE_SUFFIX}"

    def write_returned(self, updates: RoundUpdates) -> None:
        """Write what the round's clients returned under a store's name (gathered over the processes; the clients
        left out of the round returned nothing that counts). Called by the engine after `post_aggregation`."""
        for name in updates.state_names():
            if name in self.stores:
                self.stores[name].write(*updates.state(name))

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Each store's `state_dict` under its name."""
        return {name: store.state_dict() for name, store in self.stores.items()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore every store from a checkpoint, which is then one the run keeps (`checkpointed`)."""
        if state is None and self.stores:
            raise ValueError(
                f"the checkpoint holds no client state (it predates it), the algorithm declares "
                f"{sorted(self.stores)}: start the run again"
            )
        state = state or {}
        if set(state) != set(self.stores):
            raise ValueError(
                f"the checkpoint holds client state {sorted(state)}, the algorithm declares "
                f"{sorted(self.stores)}: resume with the algorithm of the run"
            )
        for name, store in self.stores.items():
            store.load_state_dict(state[name])
        self.checkpointed()

    def checkpointed(self) -> None:
        """A round checkpoint was taken (called on every process): no row it refers to is overwritten while it may
        still be read back (`fedlight.engine.spill`)."""
        for store in self.stores.values():
            store.checkpointed()
