"""SR-FCA (Vardhan, Ghosh, Mazumdar: "An Improved Federated Clustering Algorithm with Model-based Clustering", TMLR
2024; "Successive Refine-and-Merge"): a one-shot clustering of the clients' local models, then refine steps that
train each cluster, recluster the clients and merge close clusters. Each piece follows the authors' code (its
`SRFCA` class and `compute_dist` / `correlation_clustering` helpers) and the paper's Algorithms 1 and 2:

- ONE-SHOT (round 1, the paper's initial clustering): every client trains its local model from the common initial
  model for `init_epochs`. The distance of two clients is the authors' `cross_entropy` metric: the mean
  cross-entropy of one's local model on the other's training data, symmetrized, (L[i, j] + L[j, i]) / 2. Clients
  within `dist_threshold` (lambda) of each other are joined by an edge; without a threshold it is the authors'
  `dist_fraction` rule, the ceil(fraction x pairs)-th (0-based) of the sorted pairwise distances. The graph is split
  by pivot correlation clustering (a random remaining client, from the (seed, round) stream, and its remaining
  neighbours form a cluster, repeated), and clusters of fewer than `size_threshold` (t) clients are dropped.
- REFINE step s (rounds 2 + s R to 1 + (s + 1) R, R = `refine_rounds`, `num_refine_steps` steps): FedAvg within each
  cluster over its members (the paper's TrimmedMeanGD: the authors' trimmed mean is the run's
  `aggregator.rule: trimmed_mean` with its beta, 0.15 in their MNIST configs; the default mean is their beta 0).
  At the step's end, RECLUSTER: each client joins the cluster at the smallest distance, the same metric between the
  cluster model and the client's local model: (loss of the cluster model on the client's data + mean loss of the
  client's local model on the data of the cluster's members) / 2; clusters of fewer than t clients are dropped.
  Then MERGE: the cluster models' distances, (mean loss of one on the other's members' data + the converse) / 2,
  under the same lambda, correlation clustering again (no size threshold, as the authors' merge), the merged
  clusters' clients pooled.
- After the last step, FedAvg within the final clusters for the rounds left.

Defaults: the authors' `size_threshold` 2 and `num_refine_steps` 2 (every config of theirs), their cross-entropy
metric; `dist_fraction` 0.3 (their tuned FEMNIST value is 0.34; their MNIST configs give a threshold instead);
`refine_rounds` 10 (theirs are 42 to 200 rounds of 5 local steps, sized for runs of hundreds of rounds);
`init_epochs` = refine_rounds x the federation's local epochs, the authors' rule (refine rounds = init iterations /
local iterations).

The distances need every local model evaluated on every client's data: `server.clients.losses` of n models over all
clients, n^2 client passes once (and K models over all clients at each step's end), fine at the cross-silo sizes the
paper uses (tens of clients), not at thousands. The one-shot round trains every client, so a
`federation.clients_per_round` below the clients is refused.

Deviations and choices:
- the local models are not kept, only their losses on every client's data (the n x n matrix L), which is all that
  RECLUSTER uses of them;
- each cluster starts its first refine step from the training-size weighted mean of its members' local models (the
  authors start every refine step from a fresh model); later steps continue from the cluster models, a merged
  cluster from its parts' models weighted by their members' training samples, so the rounds add up;
- the authors' one-shot keeps clusters of more than t clients and their recluster clusters of at least t; both keep
  at least t here, as the paper states;
- a client in no kept cluster does not train (as the authors'), but every client is evaluated: it takes the kept
  cluster at the smallest mean one-shot distance to its members, after a RECLUSTER its nearest kept cluster; the
  authors do not evaluate such clients;
- a recluster that leaves no cluster of t clients keeps the largest (the authors' code raises); a one-shot clustering
  with none is refused in one line naming the settings;
- the mean cross-entropy is per sample (the authors' `compute_metric` adds batch means and divides by the samples);
  FedAvg weights the members by training samples (their mean is unweighted);
- a client left out of round 1 (a non-finite model) has no distances, so it is in no one-shot cluster;
- a newcomer takes the cluster model with the lowest loss on its training data (the base class's rule: RECLUSTER's
  first term; it has no local model of the one-shot round for the second).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin import Algorithm, Plan, RoundUpdates, Trained, share_count

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def pivot_clusters(adjacency: np.ndarray, order: Sequence[int] | np.ndarray) -> list[list[int]]:
    """Pivot correlation clustering of an undirected graph (a symmetric boolean matrix): the first node of `order`
    not yet clustered and its unclustered neighbours form a cluster, repeated until every node is in one."""
    left = np.ones(len(adjacency), dtype=bool)
    clusters = []
    for pivot in order:
        if not left[pivot]:
            continue
        members = np.flatnonzero(left & adjacency[pivot])
        cluster = sorted({int(pivot), *members.tolist()})
        left[cluster] = False
        clusters.append(cluster)
    return clusters


def correlation_clustering(adjacency: np.ndarray, rng: np.random.Generator) -> list[list[int]]:
    """Pivot correlation clustering with uniformly random pivots (the first of a random order is a uniform choice
    among the nodes left), as the authors' `correlation_clustering`."""
    return pivot_clusters(adjacency, rng.permutation(len(adjacency)))


def cross_loss_distance(losses: Tensor) -> Tensor:
    """(n, n) distances of n local models from L[i, j], model i's mean loss on client j's data: (L[i, j] + L[j, i])
    / 2, the authors' symmetrized cross-entropy."""
    return (losses + losses.T) / 2


def fraction_threshold(distance: Tensor, fraction: float) -> float:
    """The authors' threshold from a fraction: the ceil(fraction x pairs)-th (0-based, at most the last) of the
    sorted finite distances of the pairs i < j; 0 when there is no pair."""
    i, j = torch.triu_indices(len(distance), len(distance), offset=1)
    pairs = distance[i, j]
    pairs = pairs[torch.isfinite(pairs)].sort().values
    if len(pairs) == 0:
        return 0.0
    return float(pairs[min(math.ceil(fraction * len(pairs)), len(pairs) - 1)])


def client_cluster_distances(model_losses: Tensor, local_losses: Tensor, members: list[Tensor]) -> Tensor:
    """(K, n) RECLUSTER distances: (loss of cluster model c on client i's data + mean over c's members j of the loss
    of client i's local model on j's data) / 2. `model_losses` is (K, n), `local_losses` L (n, n)."""
    theirs = torch.stack([local_losses[:, m].nanmean(dim=1) for m in members])
    return (model_losses + theirs) / 2


def cluster_pair_distances(model_losses: Tensor, members: list[Tensor]) -> Tensor:
    """(K, K) MERGE distances: (mean loss of model c on the data of c''s members + that of model c' on c's) / 2."""
    on_members = torch.stack([model_losses[:, m].mean(dim=1) for m in members], dim=1)  # [c, c']: model c on c''s
    return (on_members + on_members.T) / 2


class SRFCA(Algorithm):
    """One-shot correlation clustering of the local models, then refine steps (FedAvg per cluster, recluster,
    merge); see the module doc.

    Args:
        dist_fraction: the threshold lambda as the fraction of client pairs below it (the authors' rule), in (0, 1).
        dist_threshold: lambda itself (the cross-entropy distance), instead of the fraction.
        size_threshold: t, the fewest clients a cluster keeps.
        num_refine_steps: refine steps (each ends with RECLUSTER and MERGE).
        refine_rounds: FedAvg rounds of each refine step.
        init_epochs: local epochs of the one-shot round (None: refine_rounds x the federation's local epochs).
        participation: share of the clustered clients per refine round (round 1 trains every client).
    """

    plan = Plan(holds_updates=True)  # the one-shot round compares every client's local model

    def __init__(
        self,
        dist_fraction: float = 0.3,
        dist_threshold: float | None = None,
        size_threshold: int = 2,
        num_refine_steps: int = 2,
        refine_rounds: int = 10,
        init_epochs: int | None = None,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if not 0 < dist_fraction < 1:
            raise ValueError(
                f"algorithm.init_args.dist_fraction must be in (0, 1), got {dist_fraction}: it is the "
                "fraction of client pairs joined in the one-shot graph"
            )
        if dist_threshold is not None and dist_threshold < 0:
            raise ValueError(
                f"algorithm.init_args.dist_threshold must be >= 0 (a cross-entropy distance), got "
                f"{dist_threshold}: give one, or null for dist_fraction"
            )
        for name, value in (
            ("size_threshold", size_threshold),
            ("num_refine_steps", num_refine_steps),
            ("refine_rounds", refine_rounds),
            ("init_epochs", init_epochs or 1),
        ):
            if value < 1:
                raise ValueError(f"algorithm.init_args.{name} must be >= 1, got {value}")
        self.dist_fraction, self.dist_threshold, self.size_threshold = dist_fraction, dist_threshold, size_threshold
        self.num_refine_steps, self.refine_rounds, self.init_epochs = num_refine_steps, refine_rounds, init_epochs
        self.threshold = math.nan  # lambda, once the one-shot round has set it
        self.local_losses = torch.empty(0)  # L[i, j]: client i's local model's mean loss on client j's training data
        self.clustered = torch.empty(0, dtype=torch.bool)  # the clients in a kept cluster (the ones that train)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.cohort.needs_every_client("SR-FCA", "in its one-shot round (round 1), whose local models it clusters")
        if self.size_threshold > server.num_clients:
            raise ValueError(
                f"algorithm.init_args.size_threshold is {self.size_threshold}, more than the "
                f"{server.num_clients} clients: give at most {server.num_clients}"
            )
        if self.init_epochs is None:
            self.init_epochs = self.refine_rounds * server.clients.trainer.local_epochs
        self.clustered = torch.zeros(server.num_clients, dtype=torch.bool, device=server.device)

    # -- rounds ----------------------------------------------------------------------------------------------------
    def select_clients(self, round: int) -> list[int]:
        """Round 1: every client. Then a `participation` share of the clients in kept clusters."""
        if round == 1:
            return list(range(self.server.num_clients))
        clustered = self.clustered.nonzero().flatten().tolist()
        m = share_count(self.participation, len(clustered))
        if m == len(clustered):
            return clustered
        return sorted(self.server.random.rng(round, "select").choice(clustered, size=m, replace=False).tolist())

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The module's SGD, for `init_epochs` in the one-shot round."""
        epochs = self.init_epochs if round == 1 else None
        return self.server.clients.train_many(round, clients, starts, epochs=epochs)

    def pre_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """Round 1: the cross-loss distances of the local models, lambda, the one-shot correlation clustering."""
        if round != 1:
            return
        held, n = updates.all(), self.server.num_clients
        losses = torch.full((n, n), math.nan, device=self.models.device)
        losses[held.clients] = self.server.clients.losses(held.params, "train").to(losses)
        distance = cross_loss_distance(losses)
        self.log_matrix("cross_loss_distance", distance)
        self.threshold = (
            self.dist_threshold if self.dist_threshold is not None else fraction_threshold(distance, self.dist_fraction)
        )
        self.log("cluster/distance_threshold", self.threshold)
        adjacency = (distance <= self.threshold).cpu().numpy()  # NaN (a left-out client) is no edge
        kept = [
            c
            for c in correlation_clustering(adjacency, self.server.random.rng(round, "pivots"))
            if len(c) >= self.size_threshold
        ]
        if not kept:
            raise ValueError(
                f"SR-FCA's one-shot clustering (lambda {self.threshold:.4g}) left no cluster of "
                f"size_threshold {self.size_threshold} clients: raise algorithm.init_args.dist_fraction "
                "(or dist_threshold) or lower size_threshold"
            )
        self.local_losses = losses
        members = [torch.as_tensor(c, device=self.models.device) for c in kept]
        nearest = torch.stack([distance[:, m].nanmean(dim=1) for m in members])  # (K, n) mean distance to members
        self.assignment = torch.nan_to_num(nearest, nan=math.inf).argmin(dim=0)
        self.clustered.zero_()
        for k, m in enumerate(members):
            self.assignment[m], self.clustered[m] = k, True
        self.models = self.models[:1].repeat(len(kept), 1)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Round 1: each cluster model the weighted mean of its members' local models; then FedAvg per cluster."""
        if round != 1:
            return super().aggregate(round, updates)
        held = updates.all()
        members = held.subset(self.clustered[held.clients])
        self.set_shared(*self.cluster_means(members, members.num_samples.to(self.models.dtype)))

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """At the end of each refine step: RECLUSTER, then MERGE."""
        step, offset = divmod(round - 1, self.refine_rounds)
        if round > 1 and offset == 0 and step <= self.num_refine_steps:
            self.refine_and_merge(round)

    def refine_and_merge(self, round: int) -> None:
        """RECLUSTER every client to its nearest cluster (clusters of fewer than t dropped), then MERGE the clusters
        whose models are within lambda of each other."""
        model_losses = self.server.clients.losses(self.models, "train").to(self.local_losses)
        members = [((self.assignment == k) & self.clustered).nonzero().flatten() for k in range(len(self.models))]
        distance = torch.nan_to_num(client_cluster_distances(model_losses, self.local_losses, members), nan=math.inf)
        nearest = distance.argmin(dim=0)
        sizes = torch.bincount(nearest, minlength=len(self.models))
        kept = (sizes >= self.size_threshold).nonzero().flatten()
        if len(kept) == 0:
            kept = sizes.argmax().reshape(1)
        nearest_kept = kept[distance[kept].argmin(dim=0)]
        self.clustered = nearest == nearest_kept  # a client whose nearest cluster was dropped does not train
        members = [(nearest == k).nonzero().flatten() for k in kept.tolist()]
        pairs = cluster_pair_distances(model_losses[kept], members)
        self.log_matrix("cluster_cross_loss_distance", pairs)
        groups = correlation_clustering(
            (pairs <= self.threshold).cpu().numpy(), self.server.random.rng(round, "pivots")
        )
        group_of = torch.empty(len(kept), dtype=torch.long, device=kept.device)
        sizes = torch.stack([self.server.clients.train_sizes[m].sum() for m in members]).to(self.models)
        models = []
        for g, parts in enumerate(groups):
            group_of[parts] = g
            weights = sizes[parts] / sizes[parts].sum()
            models.append(weights @ self.models[kept[parts]])
        position = torch.full((len(self.models),), -1, dtype=torch.long, device=kept.device)
        position[kept] = torch.arange(len(kept), device=kept.device)
        self.assignment = group_of[position[nearest_kept]]
        self.models = torch.stack(models)

    # -- queries ---------------------------------------------------------------------------------------------------
    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy() if len(self.local_losses) else None

    def round_metrics(self) -> dict[str, float]:
        if not len(self.local_losses):
            return {}
        return {"cluster/clusters": float(len(self.models)), "cluster/unclustered": float((~self.clustered).sum())}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "threshold": self.threshold,
            "local_losses": self.local_losses,
            "clustered": self.clustered,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.threshold, self.local_losses = state["threshold"], state["local_losses"]
        self.clustered = state["clustered"]
