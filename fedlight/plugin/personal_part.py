"""The personal part of the clients' models (`Algorithm.personal_mask`) kept as a client-state store
(`fedlight.plugin.client_state`), so memory grows with the clients a run touches, not with all clients.

`Algorithm.personal` is a store of rows of the p personal entries, written for the clients that trained
(`Algorithm.aggregate`). A client never written reads its `PersonalStart` row: the personal values it held when the
mask was set (its cluster model's values then), kept as one row per cluster, not per client. When the mask changes
(`Algorithm.set_personal_mask`) the rows move to a new store of the new width, named with the next generation
(`store_name`): `reslice` writes them a chunk of clients at a time, and `leaving_means` averages the entries that stop
being personal per cluster, over the stored rows and, for the clients never written, their start rows once each.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedlight.plugin.aggregation import ClusterAverage
from fedlight.plugin.client_state import ClientState
from fedlight.plugin.updates import Updates

STORE = "personal_part"
CHUNK_BYTES = 1 << 28  # bytes of rows re-sliced at a time (256 MiB)


def store_name(generation: int) -> str:
    """The store of the `generation`-th personal mask: a new name at every change, so the spill file of the store
    before (which a kept checkpoint may still read) is never overwritten by rows of another width."""
    return f"{STORE}.{generation}"


class PersonalStart:
    """What a client never written reads: row `group[client]` of `rows` (G, p).

    Set from the cluster models (`first`: G = clusters, `group` the assignment then) and re-sliced at each mask
    change (`resliced`), so G stays the number of (cluster, earlier start row) pairs in use, not the clients."""

    def __init__(self, rows: Tensor, group: Tensor) -> None:
        self.rows, self.group = rows, group

    @classmethod
    def first(cls, cluster_values: Tensor, assignment: Tensor) -> "PersonalStart":
        """Each client starts from its cluster's values `cluster_values` (K, p): what a newly set mask gives."""
        return cls(cluster_values.clone(), assignment.clone())

    def __call__(self, clients: Tensor) -> Tensor:
        """(len(clients), p) the clients' start rows (a copy)."""
        return self.rows[self.group[clients.to(self.group.device)]]

    def resliced(self, cluster_values: Tensor, assignment: Tensor, kept: Tensor, from_old: Tensor) -> "PersonalStart":
        """The start rows under a new mask: each client's cluster values `cluster_values` (K, p_new) with the entries
        that stay personal (`kept`, over the new part; `from_old`, the same entries over the old part) taken from
        its start row here."""
        if not bool(kept.any()):
            return PersonalStart.first(cluster_values, assignment)
        width = len(self.rows)
        pairs, group = torch.unique(assignment * width + self.group, return_inverse=True)
        rows = cluster_values[pairs // width]
        rows[:, kept] = self.rows[pairs % width][:, from_old]
        return PersonalStart(rows, group)


def chunks(clients: Tensor, row_bytes: int) -> list[Tensor]:
    """`clients` in chunks whose rows of `row_bytes` take about `CHUNK_BYTES` (at least one client each)."""
    step = max(1, CHUNK_BYTES // max(1, row_bytes))
    return [clients[begin : begin + step] for begin in range(0, len(clients), step)]


def leaving_means(
    store: ClientState, start: PersonalStart, assignment: Tensor, sizes: Tensor, columns: Tensor, clusters: int
) -> tuple[Tensor, Tensor]:
    """(clusters with weight, the training-set-size weighted mean of their members' personal values on `columns`,
    a boolean mask over the personal part): the stored rows a chunk at a time, and each (cluster, start row) pair
    of the clients never written once, with their summed weight (every such client holds that row)."""
    average = ClusterAverage(clusters, int(columns.sum()), store.dtype, store.device)
    touched = store.touched()
    for chunk in chunks(touched, store.row_bytes):
        average.add(assignment[chunk], sizes[chunk], store.read(chunk)[:, columns])
    untouched = torch.ones(len(assignment), dtype=torch.bool, device=assignment.device)
    untouched[touched] = False
    width = len(start.rows)
    pairs, which = torch.unique(assignment[untouched] * width + start.group[untouched], return_inverse=True)
    weights = torch.zeros(len(pairs), dtype=torch.float64, device=pairs.device)
    weights.index_add_(0, which, sizes[untouched].to(torch.float64))
    average.add(pairs // width, weights, start.rows[pairs % width][:, columns])
    return average.means()


def reslice(
    old: ClientState | None,
    new: ClientState,
    cluster_values: Tensor,
    assignment: Tensor,
    kept: Tensor,
    from_old: Tensor,
    updates: Updates | None,
    mask: Tensor,
) -> None:
    """Write into `new` (the personal part under `mask`) the rows of the clients `old` stored, and of the clients in
    `updates` when entries become personal: each client's cluster values `cluster_values` (K, p_new), with the
    entries that stay personal (`kept`; `from_old` over the old part) from its row in `old`, and the newly personal
    ones, for a client in `updates`, from its trained model. Other clients read `new`'s start rows, which hold the
    same values. A chunk of clients at a time."""
    device = new.device
    clients = old.touched() if old is not None else torch.zeros(0, dtype=torch.long, device=device)
    fresh = ~kept
    trained_row = None
    if updates is not None and bool(fresh.any()):
        updated = updates.clients.to(device)
        clients = torch.unique(torch.cat([clients, updated]))
        trained_row = torch.full((new.num_clients,), -1, dtype=torch.long, device=device)
        trained_row[updated] = torch.arange(len(updated), device=device)
    element = torch.empty((), dtype=new.dtype).element_size()
    for chunk in chunks(
        clients,
        new.row_bytes
        + (old.row_bytes if old is not None else 0)
        + (element * len(mask) if trained_row is not None else 0),
    ):
        rows = cluster_values[assignment[chunk]]
        if old is not None and bool(kept.any()):
            rows[:, kept] = old.read(chunk)[:, from_old]
        if trained_row is not None and updates is not None:  # (a trained row comes from `updates`)
            position = trained_row[chunk]
            own = position >= 0
            if bool(own.any()):
                trained = rows[own]
                trained[:, fresh] = updates.params[position[own]][:, mask][:, fresh]
                rows[own] = trained
        new.write(chunk, rows)
