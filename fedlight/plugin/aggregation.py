"""Cluster-wise weighted averages as running sums, so a round's updates can arrive a group of clients at a time
(memory then holds one group's models, never clients x parameters), and per-client models built on demand."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import torch
from torch import Tensor

from fedlight.cluster.differences import Differences

if TYPE_CHECKING:
    from fedlight.plugin.round_updates import RoundUpdates


class ClusterAverage:
    """Weighted sums of rows per cluster, and the weight each cluster received.

    The sums are kept in float64 and the means rounded to the models' dtype once: every float32 product
    w * x is then exact and the additions err far below float32's resolution, so the means do not depend on the
    order the rows arrive in (groups of any size, or shards added over processes) but for a rare last-bit tie."""

    #: rows of `Differences` built at a time (their float64 size, 256 MiB), so a large group is never built whole
    CHUNK_BYTES = 1 << 28
    #: float64 entries converted at a time (2 MiB: rows x a block of columns), so that the converted block and the
    #: sums' columns it adds into stay in the cache while every row is added: 4x faster than a row at a time for 10
    #: rows of 6.6 M entries (memory traffic of one pass over the sums instead of one a row), the same sums
    CACHE_BYTES = 1 << 21
    #: whether `add` reads the rows' starts: a mean does not, so a caller may skip building them (None)
    reads_starts = False

    def __init__(self, clusters: int, dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype = dtype
        self.sums = torch.zeros(clusters, dim, dtype=torch.float64, device=device)
        self.totals = torch.zeros(clusters, dtype=torch.float64, device=device)

    def add(
        self, clusters: Tensor, weights: Tensor, values: Tensor | Differences, starts: Tensor | None = None
    ) -> None:
        """Add row i of `values` with weight `weights[i]` to cluster `clusters[i]`: a weighted membership matrix
        times the rows, a block of columns at a time (`Differences`, e.g. the updates, are built a chunk of rows at a
        time, so they are never held whole). `starts` (the models the rows were trained from) is not needed:
        a mean commutes with shifting every row; other cluster aggregators take it (`cluster_aggregator`)."""
        member = torch.zeros(len(self.sums), len(values), dtype=torch.float64, device=values.device)
        member[clusters, torch.arange(len(values), device=values.device)] = weights.to(torch.float64)
        width = max(1, values.shape[1])
        at_once = max(1, len(values) if isinstance(values, Tensor) else self.CHUNK_BYTES // (8 * width))
        for begin in range(0, len(values), at_once):
            rows = values[begin : begin + at_once]  # a tensor's rows are a view; `Differences` builds them here
            weight = member[:, begin : begin + len(rows)]
            block = self.column_block(rows, width)
            for column in range(0, width, block):
                part = rows[:, column : column + block].to(torch.float64)
                self.sums[:, column : column + block].addmm_(weight, part)
        self.totals += member.sum(dim=1)

    def column_block(self, rows: Tensor, width: int) -> int:
        """Columns of `rows` worked on at a time: `CACHE_BYTES` of float64 entries over all the rows on a CPU (they
        stay in the cache), every column elsewhere."""
        return max(1, self.CACHE_BYTES // (8 * max(1, len(rows)))) if rows.device.type == "cpu" else width

    def reduce(self, updates: "RoundUpdates") -> None:
        """Add the sums over the processes (streamed rounds; a held round has every row on every process)."""
        updates.sum_over_processes_(self.sums, self.totals)

    def means(self) -> tuple[Tensor, Tensor]:
        """(clusters that received weight, their weighted means in the rows' dtype)."""
        active = (self.totals > 0).nonzero().flatten()
        sums = self.sums if len(active) == len(self.sums) else self.sums[active]
        totals = self.totals[active, None]
        means = torch.empty(sums.shape, dtype=self.dtype, device=sums.device)
        width = max(1, sums.shape[1])
        block = self.column_block(sums, width)  # no float64 copy of the sums
        for column in range(0, width, block):
            means[:, column : column + block] = sums[:, column : column + block] / totals
        return active, means


M = TypeVar("M")  # a client's model: a flat model (a tensor), or a predictor of the algorithm's own


class ClientModels(Sequence[M], Generic[M]):
    """Every client's own model, built on demand by `model_of(client)`: evaluating n personalized clients then
    needs one full model at a time besides the stored personal parts, not n full models."""

    def __init__(self, model_of: Callable[[int], M], num_clients: int) -> None:
        self.model_of, self.num_clients = model_of, num_clients

    def __len__(self) -> int:
        return self.num_clients

    @overload
    def __getitem__(self, client: int) -> M: ...

    @overload
    def __getitem__(self, client: slice) -> list[M]: ...

    def __getitem__(self, client: int | slice) -> M | list[M]:
        if isinstance(client, slice):  # a Sequence's slice: those clients' models
            return [self.model_of(c) for c in range(self.num_clients)[client]]
        if not 0 <= client < self.num_clients:
            raise IndexError(f"client {client} out of range for {self.num_clients} clients")
        return self.model_of(client)
