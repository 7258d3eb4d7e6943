"""OCFL: one-shot clustered FL (Zuziak, Pellungrini, Rinzivillo: "One-Shot Clustering for Federated Learning Under
Clustering-Agnostic Assumption", Algorithm 1 in section 3.3; the temperature is Definition 7).

Every round, while no clustering has happened, the server computes the cosine-distance matrix Gamma of the
clients' updates and its temperature T = ||Gamma||_p / (n(n-1)2^p)^(1/p) (in [0, 1]). The first round whose
temperature does not fall (T_t > T_{t-1}, the code's strict rule; `strict=False` gives the paper's >=) fires
the one shot: a clustering component splits the clients, every child cluster starts from the parent's model,
and from then on each cluster averages its members' deltas (unweighted) with a server learning rate.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin import Algorithm, GroupModels, Newcomers, Plan, RoundUpdates, Updates, nearest_update_direction
from fedlight.cluster.clusterers import HDBSCAN, Clusterer
from fedlight.cluster.differences import Differences
from fedlight.cluster.similarity import cosine_distance_matrix

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def temperature(gamma: Tensor, p: float = 2.0) -> float:
    """||Gamma||_p (entry-wise) divided by its largest possible value, all off-diagonal entries equal to 2."""
    n = gamma.shape[0]
    if n < 2:
        return 0.0
    norm = gamma.abs().pow(p).sum().pow(1.0 / p)
    return float(norm / (n * (n - 1) * 2.0**p) ** (1.0 / p))


class OCFL(Algorithm):
    """One-shot clustering on the temperature of the update cosine distances.

    Args:
        clusterer: any clustering component on a distance matrix; default HDBSCAN with min_cluster_size 20%
            of the clients (the paper's setting).
        p: the entry-wise norm of the temperature (2, as in the authors' code).
        strict: fire on T_t > T_{t-1} (code) rather than >= (paper).
        window: compare moving averages of the last `window` temperatures (1 = the paper's rule).
        min_rounds: never fire before this round (not in the paper; our guard; 1 = off).
        include_buffers: cluster on parameters and buffers (the authors' state_dict) instead of parameters.
        server_lr: step of the cluster model along its members' mean delta (1 = FedAvg).
        weighted: weight deltas by training-set size (the paper averages unweighted).
        participation: share of clients per round (the paper trains all; with fewer, a client not present
            at the shot joins the cluster whose mean delta is closest to its own when it first trains).
    """

    plan = Plan(holds_updates=True)  # clusters on the cosine distances of every update

    def __init__(
        self,
        clusterer: Clusterer | None = None,
        p: float = 2.0,
        strict: bool = True,
        window: int = 1,
        min_rounds: int = 1,
        include_buffers: bool = False,
        server_lr: float = 1.0,
        weighted: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if window < 1 or p <= 0 or server_lr <= 0:
            raise ValueError("OCFL needs window >= 1, p > 0 and server_lr > 0")
        self.clusterer = clusterer if clusterer is not None else HDBSCAN(min_cluster_size=0.2)
        self.p, self.strict, self.window, self.min_rounds = p, strict, window, min_rounds
        self.include_buffers, self.server_lr, self.weighted = include_buffers, server_lr, weighted
        self.temperatures: list[float] = []
        self.clustered_round = 0
        self.unassigned = torch.empty(0, dtype=torch.bool)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.mask = None if self.include_buffers else server.model.parameter_mask()
        self.unassigned = torch.zeros(server.num_clients, dtype=torch.bool, device=server.device)

    def triggered(self) -> bool:
        """Whether the latest temperature (its moving average over `window` rounds) did not fall: T_t > T_{t-1}
        (strict) or >=, with T_0 = +inf, so the first round never fires."""
        t, w = self.temperatures, self.window
        current = float(np.mean(t[-w:]))
        previous = float(np.mean(t[-w - 1 : -1])) if len(t) > 1 else math.inf
        return current > previous if self.strict else current >= previous

    def pre_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """Until the shot: the update cosine distances (logged), their temperature, and the shot when it fires;
        after it: clients seen for the first time join a cluster. The updates are read a block at a time
        (`delta_rows`), never held besides the trained models."""
        held = updates.all()
        deltas = held.delta_rows(self.mask)
        if self.clustered_round:
            self._place_newcomers(held, deltas)
            return
        gamma = cosine_distance_matrix(deltas)
        self.log_matrix("update_cosine_distance", gamma)
        self.temperatures.append(temperature(gamma, self.p))
        if self.triggered() and round >= self.min_rounds and len(held) > 1:
            self._split(round, held, gamma)

    def _split(self, round: int, updates: Updates, gamma: Tensor) -> None:
        labels = torch.as_tensor(
            self.clusterer.fit_predict(gamma.cpu().numpy(), kind="distance"), device=self.models.device
        )
        parent = self.models[0]
        self.models = parent.repeat(int(labels.max()) + 1, 1)
        self.unassigned[:] = True
        self.unassigned[updates.clients] = False
        self.assignment[updates.clients] = labels
        self.clustered_round = round

    def _place_newcomers(self, updates: Updates, deltas: Differences) -> None:
        """Clients absent at the shot join the cluster whose members' mean delta is nearest in cosine (the means
        weigh the newcomers' rows 0, so no row is copied for them; only the newcomers' own deltas are built)."""
        new = self.unassigned[updates.clients]
        if not new.any():
            return
        known = ~new
        if not known.any():
            return
        active, centers = self.cluster_means(updates, known.to(self.models.dtype), deltas)
        distances = cosine_distance_matrix(torch.cat([deltas[new], centers]))[: int(new.sum()), int(new.sum()) :]
        chosen = updates.clients[new]
        self.assignment[chosen] = active[distances.argmin(dim=1)]
        self.unassigned[chosen] = False

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Each cluster moves by server_lr times its members' mean delta (unweighted by default), the deltas built
        a chunk of rows at a time."""
        held = updates.all()
        weights = held.num_samples if self.weighted else torch.ones_like(held.num_samples)
        active, mean_delta = self.cluster_means(held, weights.to(self.models.dtype), held.delta_rows())
        self.set_shared(active, self.models[active] + self.server_lr * mean_delta)

    def newcomer_models(self, newcomers: Newcomers) -> tuple[GroupModels, Tensor, Tensor | None]:
        """A newcomer joins the cluster its own update points to, by the cosine criterion OCFL clusters with:
        before the shot every one has the one model; after it, its update from the clients' mean model against
        each cluster's direction from there (`nearest_update_direction`, on the parameters the shot compared)."""
        if len(self.models) == 1:
            return super().newcomer_models(newcomers)
        members = torch.bincount(self.assignment, minlength=len(self.models))
        placed = nearest_update_direction(newcomers, self.models, members, self.mask)
        return self.models, placed, placed

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy()

    def round_metrics(self) -> dict[str, float]:
        return {
            "cluster/temperature": self.temperatures[-1] if self.temperatures else float("nan"),
            "cluster/clustered_round": float(self.clustered_round),
        }

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "temperatures": list(self.temperatures),
            "clustered_round": self.clustered_round,
            "unassigned": self.unassigned,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.temperatures = list(state["temperatures"])
        self.clustered_round = state["clustered_round"]
        self.unassigned = state["unassigned"]
