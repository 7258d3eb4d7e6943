"""FeSEM (Xie, Long, Zhou, Jiang, Chen: "Multi-Center Federated Learning", arXiv 2020; as "Multi-center federated
learning: clients clustering for better personalization", World Wide Web 2023; the section on federated stochastic
expectation maximization, FeSEM, and its algorithm).

K center models. Every round, each selected client trains its center's model on its data (its local model W_i);
then the server runs one step of k-means on the local models:
- E-step: each client joins the center nearest to its local model in L2 distance;
- M-step: each center becomes the mean of its members' local models (a center without a member this round keeps
  its model).

Defaults and choices:
- `num_clusters` = 4, a starting point (the paper sets K per experiment; give the true count when known);
- the centers are seeded by k-means (the best of 10 k-means++ restarts refined by Lloyd) on the local models of
  round `seed_round`, which trains every client from the one model of FedAvg before it (`seed_round` = 1: from
  the initial model); each center is then its members' mean. A run with `federation.clients_per_round` below
  the clients is therefore refused.
  Centers drawn independently of the clients, as a random initialization would be, leave every client nearest the
  model it started from; and local models one round away from a random initialization differ mostly by noise, so
  a later seeding round (a FedAvg warm-up, as IFCA's `warmup_rounds`) separates the clusters better: the digits
  config seeds in round 3;
- `weighted` = True: the M-step weights members by training-set size, as FedAvg does, so K = 1 is FedAvg; `false`
  gives the plain mean of the paper's M-step;
- the local models are the module's SGD from the center, without the paper's distance regularizer
  lambda ||W_i - center||^2 (the local update starts from the center instead);
- distances use the trainable parameters (buffers such as BatchNorm statistics left out).

A client that arrives after training trains the mean of the centers (weighted by their members' training-set sizes,
the model FedAvg would hold) on its data, and joins the center nearest to its local model: the E-step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedlight.cluster import kcenters
from fedlight.plugin import Algorithm, GroupModels, Newcomers, Plan, RoundUpdates

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class FeSEM(Algorithm):
    """Federated stochastic EM on model weights: k-means of the clients' local models, one step per round.

    Args:
        num_clusters: K, the number of centers.
        seed_round: the round whose local models seed the centers (one FedAvg model before it).
        weighted: M-step weighted by training-set size (K = 1 is FedAvg); False: the plain mean.
        participation: share of clients per round (all in the seeding round).
    """

    plan = Plan(holds_updates=True)  # the E-step compares every local model with the centers

    def __init__(
        self, num_clusters: int = 4, seed_round: int = 1, weighted: bool = True, participation: float = 1.0
    ) -> None:
        super().__init__(participation)
        if num_clusters < 1:
            raise ValueError(f"algorithm.init_args.num_clusters must be >= 1, got {num_clusters}")
        if seed_round < 1:
            raise ValueError(f"algorithm.init_args.seed_round must be >= 1, got {seed_round}")
        self.num_clusters, self.seed_round, self.weighted = num_clusters, seed_round, weighted
        self.seeded = False

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.cohort.needs_every_client(type(self).__name__, f"in its seeding round (seed_round {self.seed_round})")
        if self.num_clusters > server.num_clients:
            raise ValueError(
                f"algorithm.init_args.num_clusters is {self.num_clusters}, more than the "
                f"{server.num_clients} clients: give at most {server.num_clients}"
            )
        self.mask = server.model.parameter_mask()

    def select_clients(self, round: int) -> list[int]:
        if round == self.seed_round and not self.seeded:
            return list(range(self.server.num_clients))
        return super().select_clients(round)

    def pre_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """The E-step (seeding the centers first, in the seeding round); before it nothing (FedAvg)."""
        if round < self.seed_round and not self.seeded:
            return
        held = updates.all()
        local = held.params[:, self.mask]
        if not self.seeded:  # k-means on the local models: the centers are then their members' means (M-step)
            generator = kcenters.generator_for(int(self.server.random.rng(round, "fesem-seeding").integers(2**62)))
            labels = kcenters.fit(local.double(), self.num_clusters, generator=generator).labels
            self.models = self.models.repeat(self.num_clusters, 1)
            self.assignment[held.clients] = labels
            self.seeded = True
            return
        distance, nearest = kcenters.nearest(local.double(), self.models[:, self.mask].double())
        self.assignment[held.clients] = nearest
        self.log("cluster/center_distance_mean", float(distance.mean()))

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The M-step: each center with members this round is their (weighted) mean local model."""
        held = updates.all()
        weights = held.num_samples if self.weighted else torch.ones_like(held.num_samples)
        self.set_shared(*self.cluster_means(held, weights.to(self.models.dtype)))

    def center_mean(self) -> Tensor:
        """The centers' mean, weighted by their members' training-set sizes (the model FedAvg would hold)."""
        sizes = torch.zeros(len(self.models), dtype=torch.float64, device=self.models.device)
        sizes.index_add_(0, self.assignment, self.server.clients.train_sizes.to(torch.float64))
        return (sizes @ self.models.double() / sizes.sum()).to(self.models.dtype)

    def newcomer_models(self, newcomers: Newcomers) -> tuple[GroupModels, Tensor, Tensor | None]:
        """Before the centers exist: the one model. After: each newcomer's local model, trained from the centers'
        mean, joins the nearest center."""
        if not self.seeded:
            return super().newcomer_models(newcomers)
        start = self.center_mean()
        count = newcomers.count
        local = newcomers.train_many(list(range(count)), start.expand(count, -1))[:, self.mask]
        groups = kcenters.nearest(local.double(), self.models[:, self.mask].double())[1]
        return self.models, groups, groups

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy() if self.seeded else None

    def round_metrics(self) -> dict[str, float]:
        return {"cluster/clustered_round": float(self.seed_round if self.seeded else 0)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seeded": self.seeded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.seeded = state["seeded"]
