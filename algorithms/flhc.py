"""FL+HC (Briggs, Fan, Andras: "Federated learning with hierarchical clustering of local updates to improve training
on non-IID data", IJCNN 2020; the section presenting FL+HC and its hyperparameters).

FedAvg until round `cluster_round`. In that round every client trains the global model and the server clusters the
clients' updates (trained minus global, the parameters) by agglomerative clustering: a distance metric, a linkage,
and a distance threshold at or above which clusters are not merged, or a cluster count. Each cluster's model is then
the FedAvg of its members' models of that round, and from then on every cluster trains on its own with FedAvg.

Defaults: Euclidean distance with Ward linkage (one of the metric/linkage pairs the paper studies, and the only
one Ward admits); `cluster_round` = 10 and `distance_threshold` = 3.0 are starting points, not the paper's values
(it studies both per data set; our digits config sets its own from the logged update distances,
`update_l2_distance`).

Deviations and choices:
- the clustering round trains every client, whatever `participation` (every client needs a cluster), so a run
  with `federation.clients_per_round` below the clients is refused;
- the updates are the trainable parameters' (buffers such as BatchNorm statistics left out), as OCFL's are;
- a client whose update is not finite in the clustering round stays in the first cluster.

A client that arrives after training trains the global model of the clustering round (kept for it) on its data, and
joins the cluster at the smallest linkage distance from its update: Ward's merge cost sqrt(2|C|/(|C|+1)) times the
distance to the cluster's mean update, or the average / largest / smallest distance to the members' updates (kept).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from sklearn.cluster import AgglomerativeClustering
from sklearn.metrics import pairwise_distances
from torch import Tensor

from fedlight.cluster.clusterers import linkage_to_clusters, relabel
from fedlight.plugin import Algorithm, GroupModels, Newcomers, Plan, RoundUpdates
from fedlight.cluster.similarity import l2_distance_matrix

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

Linkage = Literal["ward", "average", "complete", "single"]
Metric = Literal["euclidean", "manhattan", "cosine"]


def ward_to_clusters(points: np.ndarray, members: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(m, k) Ward linkage distance of each point, as a cluster of one, to each cluster of `members`:
    sqrt(2 |C| / (|C| + 1)) ||x - mean(C)||, the distance scikit-learn's Ward tree merges at."""
    out = []
    for k in range(int(labels.max()) + 1):
        cluster = members[labels == k]
        size = len(cluster)
        out.append(np.sqrt(2 * size / (size + 1)) * np.linalg.norm(points - cluster.mean(axis=0), axis=1))
    return np.stack(out, axis=1)


class FLHC(Algorithm):
    """FedAvg, then one agglomerative clustering of the clients' updates, then FedAvg per cluster.

    Args:
        cluster_round: the round whose updates are clustered (FedAvg before it).
        distance_threshold: the linkage distance at or above which clusters are not merged.
        num_clusters: a cluster count instead of the threshold (give one of the two).
        linkage: "ward" (Euclidean only), "average", "complete" or "single".
        metric: "euclidean", "manhattan" or "cosine".
        participation: share of clients per round (all in the clustering round).
    """

    plan = Plan(holds_updates=True)  # the clustering round compares every update

    def __init__(
        self,
        cluster_round: int = 10,
        distance_threshold: float | None = 3.0,
        num_clusters: int | None = None,
        linkage: Linkage = "ward",
        metric: Metric = "euclidean",
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if cluster_round < 1:
            raise ValueError(f"algorithm.init_args.cluster_round must be >= 1, got {cluster_round}")
        if linkage == "ward" and metric != "euclidean":
            raise ValueError(
                f"algorithm.init_args.linkage ward needs metric euclidean, got {metric!r}: set "
                "algorithm.init_args.linkage to average, complete or single"
            )
        if num_clusters is not None:
            distance_threshold = None  # a count replaces the default threshold
            if num_clusters < 1:
                raise ValueError(f"algorithm.init_args.num_clusters must be >= 1, got {num_clusters}")
        elif distance_threshold is None:
            raise ValueError("FL+HC needs algorithm.init_args.distance_threshold or algorithm.init_args.num_clusters")
        self.cluster_round, self.distance_threshold, self.num_clusters = cluster_round, distance_threshold, num_clusters
        self.linkage, self.metric = linkage, metric
        self.clustered = False
        self.reference = torch.empty(0)  # the global model the clustered updates started from
        self.cluster_updates = torch.empty(0)  # the clustered updates (rows of `members`)
        self.members = torch.empty(0, dtype=torch.long)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.cohort.needs_every_client(
            type(self).__name__, f"in its clustering round (cluster_round {self.cluster_round})"
        )
        if self.num_clusters is not None and self.num_clusters > server.num_clients:
            raise ValueError(
                f"algorithm.init_args.num_clusters is {self.num_clusters}, more than the "
                f"{server.num_clients} clients: give at most {server.num_clients}"
            )
        self.mask = server.model.parameter_mask()

    def select_clients(self, round: int) -> list[int]:
        if round == self.cluster_round:
            return list(range(self.server.num_clients))
        return super().select_clients(round)

    def cluster(self, updates: np.ndarray) -> np.ndarray:
        """Labels 0..k-1 of the rows of `updates` by scikit-learn's agglomerative clustering."""
        if len(updates) < 2:
            return np.zeros(len(updates), dtype=np.int64)
        model = AgglomerativeClustering(
            n_clusters=self.num_clusters,
            distance_threshold=self.distance_threshold,
            metric=self.metric,
            linkage=self.linkage,
        )
        return relabel(model.fit_predict(updates))

    def pre_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """In the clustering round: cluster the updates; every cluster model starts from the global one (and is then
        averaged over its members by `aggregate`)."""
        if round != self.cluster_round or self.clustered:
            return
        held = updates.all()
        deltas = held.masked_deltas(self.mask)
        self.log_matrix("update_l2_distance", l2_distance_matrix(deltas))
        labels = torch.as_tensor(self.cluster(deltas.double().cpu().numpy()), device=self.models.device)
        self.reference = self.models[0].clone()
        self.cluster_updates, self.members = deltas.clone(), held.clients.clone()
        self.models = self.models.repeat(int(labels.max()) + 1, 1)
        self.assignment[held.clients] = labels
        self.clustered = True

    def newcomer_models(self, newcomers: Newcomers) -> tuple[GroupModels, Tensor, Tensor | None]:
        """Before the clustering: the global model. After: each newcomer's update from the clustering round's global
        model joins the cluster at the smallest linkage distance."""
        if not self.clustered:
            return super().newcomer_models(newcomers)
        count = newcomers.count
        trained = newcomers.train_many(list(range(count)), self.reference.expand(count, -1))
        mine = (trained - self.reference)[:, self.mask].double().cpu().numpy()
        theirs = self.cluster_updates.double().cpu().numpy()
        labels = self.assignment[self.members].cpu().numpy()
        if self.linkage == "ward":
            distances = ward_to_clusters(mine, theirs, labels)
        else:
            distances = linkage_to_clusters(pairwise_distances(mine, theirs, metric=self.metric), labels, self.linkage)
        groups = torch.as_tensor(distances.argmin(axis=1), device=self.models.device)
        return self.models, groups, groups

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy() if self.clustered else None

    def round_metrics(self) -> dict[str, float]:
        return {"cluster/clustered_round": float(self.cluster_round if self.clustered else 0)}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "clustered": self.clustered,
            "reference": self.reference,
            "cluster_updates": self.cluster_updates,
            "members": self.members,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clustered, self.reference = state["clustered"], state["reference"]
        self.cluster_updates, self.members = state["cluster_updates"], state["members"]
