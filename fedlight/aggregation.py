"""Cluster-wise weighted averages as running sums, so a round's updates can arrive a group of clients at a time
(memory then holds one group's models, never clients x parameters), and per-client models built on demand."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from fedlight.updates import Updates

if TYPE_CHECKING:
    from fedlight.algorithm import Algorithm


class ClusterAverage:
    """Weighted sums of rows per cluster, and the weight each cluster received."""

    def __init__(self, clusters: int, dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.sums = torch.zeros(clusters, dim, dtype=dtype, device=device)
        self.totals = torch.zeros(clusters, dtype=dtype, device=device)

    def add(self, clusters: Tensor, weights: Tensor, values: Tensor) -> None:
        """Add row i of `values` with weight `weights[i]` to cluster `clusters[i]`: one matrix product."""
        member = torch.zeros(len(self.sums), len(values), dtype=values.dtype, device=values.device)
        member[clusters, torch.arange(len(values), device=values.device)] = weights.to(values.dtype)
        self.sums.addmm_(member.to(self.sums.dtype), values.to(self.sums.dtype))
        self.totals += member.sum(dim=1).to(self.totals.dtype)

    def means(self) -> tuple[Tensor, Tensor]:
        """(clusters that received weight, their weighted means)."""
        active = (self.totals > 0).nonzero().flatten()
        return active, self.sums[active] / self.totals[active, None]


def average_in_clusters(algorithm: "Algorithm", groups: Iterable[Updates]) -> None:
    """FedAvg within each cluster: every cluster's shared part becomes the training-set-size weighted mean of its
    members' trained models, and every client keeps its trained personal part. `groups` may be a generator that
    trains each group as it is asked for."""
    models = algorithm.models
    average = ClusterAverage(len(models), models.shape[1], models.dtype, models.device)
    for updates in groups:
        average.add(algorithm.assignment[updates.clients], updates.num_samples.to(models.dtype), updates.params)
        if algorithm.personal_mask is not None:
            algorithm.personal[updates.clients] = updates.params[:, algorithm.personal_mask]
        del updates  # or it would stay alive while the next group trains: two groups in memory
    algorithm.set_shared(*average.means())


class ClientModels(Sequence):
    """Every client's own model, built on demand by `model_of(client)`: evaluating n personalized clients then
    needs one full model at a time besides the stored personal parts, not n full models."""

    def __init__(self, model_of: Callable[[int], Tensor], num_clients: int) -> None:
        self.model_of, self.num_clients = model_of, num_clients

    def __len__(self) -> int:
        return self.num_clients

    def __getitem__(self, client: int) -> Tensor:
        if not 0 <= client < self.num_clients:
            raise IndexError(f"client {client} out of range for {self.num_clients} clients")
        return self.model_of(client)
