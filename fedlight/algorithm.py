"""The plugin boundary: an `Algorithm` decides what each client starts from and how updates are combined.

The base class is FedAvg, written in the general form most algorithms share (DESIGN.md section 4): the
server holds K cluster models as rows of one matrix, an assignment of every client to a cluster, and, when
some layers are personal, each client's personal part. A clustered algorithm changes the assignment in
`pre_aggregation`; a personalized one names its personal layers in `personal_layers`; everything else
(cluster-wise weighted averaging, merging shared and personal parts, checkpointing) is inherited.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from fedlight.federation import Federation


@dataclass
class Updates:
    """What the selected clients sent back in one round, stacked: row i belongs to `clients[i]`."""

    clients: Tensor      # (m,) long, client ids
    params: Tensor       # (m, d) trained flat models
    starts: Tensor       # (m, d) the flat models each client started from
    num_samples: Tensor  # (m,) training-set sizes
    train_loss: Tensor   # (m,) mean training loss of the last local epoch

    @property
    def deltas(self) -> Tensor:
        """Each client's change to its starting model (trained minus start)."""
        return self.params - self.starts

    def __len__(self) -> int:
        return len(self.clients)

    def subset(self, rows: Tensor) -> "Updates":
        """The updates of the rows selected by a boolean mask or an index tensor."""
        return Updates(self.clients[rows], self.params[rows], self.starts[rows], self.num_samples[rows],
                       self.train_loss[rows])


class ClusterAverage:
    """Weighted sums of rows per cluster, so that a cluster-wise average can take its rows a group at a time
    (a round's clients need not all be in memory at once)."""

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


class ClientModels(Sequence):
    """Every client's own model, built on demand by `client_model`: evaluating n personalized clients then
    needs one full model at a time besides the stored personal parts, not n full models."""

    def __init__(self, algorithm: "Algorithm") -> None:
        self.algorithm = algorithm

    def __len__(self) -> int:
        return self.algorithm.fed.num_clients

    def __getitem__(self, client: int) -> Tensor:
        if not 0 <= client < len(self):
            raise IndexError(f"client {client} out of range for {len(self)} clients")
        return self.algorithm.client_model(client)


class Algorithm:
    """FedAvg, and the base class of every algorithm. Override only the hooks an algorithm changes.

    Args:
        participation: share of clients selected each round (at least one), drawn from a per-round stream
            that depends only on (seed, round), so resumed and uninterrupted runs select the same clients.
    """

    def __init__(self, participation: float = 1.0) -> None:
        if not 0 < participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {participation}")
        self.participation = participation
        self.fed: Federation | None = None
        self.models = torch.empty(0)
        self.assignment = torch.empty(0, dtype=torch.long)
        self.personal_mask: Tensor | None = None
        self.personal: Tensor | None = None

    # -- set-up ------------------------------------------------------------------------------------
    def setup(self, fed: "Federation") -> None:
        """Called once before the first round: one global model, every client in cluster 0."""
        self.fed = fed
        self.models = fed.initial_params.unsqueeze(0).clone()
        self.assignment = torch.zeros(fed.num_clients, dtype=torch.long, device=fed.device)
        layers = self.personal_layers(fed.flat.layers())
        if layers:
            self.personal_mask = fed.flat.layer_mask(layers)
            self.personal = fed.initial_params[self.personal_mask].repeat(fed.num_clients, 1)

    def personal_layers(self, layers: list[str]) -> list[str]:
        """Names of the layers each client keeps for itself (none by default), chosen from `layers`."""
        return []

    # -- one round ---------------------------------------------------------------------------------
    def select_clients(self, round: int) -> list[int]:
        """The clients that train this round: a `participation` share, sampled without replacement."""
        n = self.fed.num_clients
        m = max(1, math.ceil(self.participation * n))
        if m == n:
            return list(range(n))
        return sorted(self.fed.rng(round, "select").choice(n, size=m, replace=False).tolist())

    def client_start(self, round: int, client: int) -> Tensor:
        """The flat model a client starts local training from: its cluster's model with its personal part."""
        return self.client_model(client)

    def train_client(self, round: int, client: int, start: Tensor) -> tuple[Tensor, Tensor]:
        """Local training of one client from `start`; returns (trained flat model, mean training loss).
        The default runs the module's own `training_step` with its optimizer (through `local_gradient`);
        an algorithm whose local objective is not a gradient step (local k-means) overrides this."""
        return self.fed.fit_client(round, client, start)

    def learning_rate_scale(self, round: int) -> float:
        """Factor on the clients' configured learning rate in this round (a server-side schedule such as a
        per-round decay); 1 by default. Applied by sequential and vectorized training alike."""
        return 1.0

    def local_gradient(self, client: int, params: Tensor, grad: Tensor, start: Tensor) -> None:
        """Change the local objective by editing the flat gradient in place after each backward pass
        (e.g. a proximal term). `params` is the current flat model, `start` the one training began from.
        The engine calls it only when a subclass overrides it."""

    def pre_aggregation(self, round: int, updates: Updates) -> None:
        """Look at the updates before averaging: cluster clients, update similarity, fire triggers."""

    def aggregate(self, round: int, updates: Updates) -> None:
        """Average the shared part of the updates within each cluster (weighted by training-set size) and keep
        each client's personal part."""
        self.aggregate_groups(round, [updates])

    def aggregate_groups(self, round: int, groups: Iterable[Updates]) -> Tensor:
        """`aggregate` over a round's updates arriving a group of clients at a time: running weighted sums per
        cluster, each group's personal parts stored as it arrives. Returns every client's training loss.

        The engine calls this instead of `pre_aggregation` + `aggregate` when an algorithm overrides neither
        (`aggregates_in_groups`), so a round holds one group's models at a time, never all of them."""
        average = ClusterAverage(len(self.models), self.models.shape[1], self.models.dtype, self.models.device)
        losses = []
        for updates in groups:
            average.add(self.assignment[updates.clients], self.aggregation_weights(updates), updates.params)
            self.store_personal(updates)
            losses.append(updates.train_loss)
            del updates  # or it would stay alive while the next group trains: two groups in memory
        self.set_shared(*average.means())
        return torch.cat(losses)

    def aggregates_in_groups(self) -> bool:
        """True when aggregation needs nothing but running sums (neither `pre_aggregation` nor `aggregate` is
        overridden), so the engine may hand the updates over group by group through `aggregate_groups`."""
        cls = type(self)
        return cls.pre_aggregation is Algorithm.pre_aggregation and cls.aggregate is Algorithm.aggregate

    def post_aggregation(self, round: int) -> None:
        """After averaging: schedules (learning rates, how many layers are shared) and bookkeeping."""

    # -- what is evaluated -------------------------------------------------------------------------
    def client_model(self, client: int) -> Tensor:
        """The flat model a client is evaluated with: its cluster's model, merged with its personal part."""
        model = self.models[self.assignment[client]]
        if self.personal_mask is None:
            return model
        model = model.clone()
        model[self.personal_mask] = self.personal[client]
        return model

    def evaluation_models(self) -> tuple[Tensor | Sequence[Tensor], Tensor]:
        """(models, group of each client): clients of one group share one model, so the engine evaluates each
        model once over its clients' data. Personalized algorithms give every client its own model, built one
        at a time (`ClientModels`)."""
        if self.personal_mask is None:
            return self.models, self.assignment
        return ClientModels(self), torch.arange(self.fed.num_clients, device=self.fed.device)

    def cluster_labels(self) -> np.ndarray | None:
        """The current client-to-cluster assignment, scored against the true clusters when the split has
        them; None when the algorithm does not cluster."""
        return None

    def round_metrics(self) -> dict[str, float]:
        """Extra scalars to log this round (thresholds, temperatures, cluster counts)."""
        return {}

    def round_matrices(self) -> dict[str, np.ndarray]:
        """Matrices computed this round worth keeping (client similarity or distance matrices): saved in the
        run folder and shown as heatmaps in W&B. Empty by default."""
        return {}

    # -- services for subclasses ---------------------------------------------------------------------
    def aggregation_weights(self, updates: Updates) -> Tensor:
        """Weights of the clients in an average: their training-set sizes (normalized per cluster later)."""
        return updates.num_samples.to(self.models.dtype)

    def cluster_means(self, updates: Updates, weights: Tensor, values: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(clusters with at least one client this round, weighted mean of their clients' `values`), as one
        matrix product over a weighted membership matrix. `values` defaults to the trained models."""
        values = updates.params if values is None else values
        average = ClusterAverage(len(self.models), values.shape[1], values.dtype, values.device)
        average.add(self.assignment[updates.clients], weights, values)
        return average.means()

    def average_into_clusters(self, updates: Updates, weights: Tensor, values: Tensor | None = None) -> None:
        """Set each cluster's shared parameters to the weighted mean of its clients' `values` (default: the
        trained models); clusters with no client this round are unchanged."""
        active, means = self.cluster_means(updates, weights, values)
        self.set_shared(active, means)

    def set_shared(self, clusters: Tensor, values: Tensor) -> None:
        """Write `values` into the shared (non-personal) parameters of the given cluster models."""
        if self.personal_mask is None:
            self.models[clusters] = values
        else:
            self.models[clusters] = torch.where(~self.personal_mask, values, self.models[clusters])

    def store_personal(self, updates: Updates) -> None:
        """Keep each client's trained personal part for its next round."""
        if self.personal_mask is not None:
            self.personal[updates.clients] = updates.params[:, self.personal_mask]

    def set_personal_mask(self, mask: Tensor | None, updates: Updates | None = None) -> None:
        """Make the entries where `mask` is True the personal part from now on (a schedule of how many layers
        are shared, or a part that is not whole layers; see `fedlight.personalization`), re-slicing every
        client's stored personal values. A mask with no True entry, or None, makes everything shared.

        An entry that becomes personal starts, for a client in `updates`, from its trained value there, and
        for every other client from its current model (`client_model`). An entry that stops being personal is
        set, in each cluster model, to the training-set-size weighted mean of its members' personal values.
        Storage stays (clients, personal entries)."""
        device, dtype = self.models.device, self.models.dtype
        new = None if mask is None or not bool(mask.any()) else mask.to(device=device, dtype=torch.bool)
        nothing = torch.zeros(self.models.shape[1], dtype=torch.bool, device=device)
        old_m = nothing if self.personal_mask is None else self.personal_mask
        new_m = nothing if new is None else new
        leaving = old_m & ~new_m
        if leaving.any():
            average = ClusterAverage(len(self.models), int(leaving.sum()), dtype, device)
            average.add(self.assignment, self.fed.train_sizes, self.personal[:, leaving[old_m]])
            active, means = average.means()
            rows = self.models[active]
            rows[:, leaving] = means
            self.models[active] = rows
        personal = None
        if new is not None:
            personal = self.models[:, new][self.assignment]  # shared until now: the cluster model's values
            kept = old_m[new]
            if kept.any():
                personal[:, kept] = self.personal[:, new[old_m]]
            if updates is not None and (~kept).any():
                rows = personal[updates.clients]
                rows[:, ~kept] = updates.params[:, new][:, ~kept]
                personal[updates.clients] = rows
        self.personal_mask, self.personal = new, personal

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that must survive a restart. Subclasses add their own keys with `super()`."""
        return {"models": self.models, "assignment": self.assignment, "personal": self.personal}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.models = state["models"]
        self.assignment = state["assignment"]
        self.personal = state["personal"]
