"""IFCA (Ghosh, Chung, Yin, Ramchandran: "An Efficient Framework for Clustered Federated Learning", NeurIPS 2020,
Algorithm 1): k cluster models; each client of a round trains the one with the lowest loss on its data."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedlight.plugin import Algorithm, Plan, RoundUpdates
from fedlight.cluster.differences import Differences
from fedlight.cluster.similarity import cosine_distance_matrix

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class IFCA(Algorithm):
    """Iterative federated clustering. At the start of a round each selected client estimates its cluster, the
    cluster model with the lowest loss on its training data (Algorithm 1's cluster identity estimation, which only
    the round's clients make), and trains that model; each cluster model becomes the size-weighted mean of its
    members that trained (a model nobody trained is unchanged). A client not selected keeps its last estimate, so
    a round's loss passes cover the cohort's rows, not every client's: 10 of FEMNIST's 3,400 writers a round cost
    10 writers' losses.

    Evaluation: in every evaluated round (`federation.eval_every`, and the last), after aggregation, every client
    estimates its cluster under the new models and is evaluated and logged with it, as the authors' evaluation picks
    every client's model at test time (their LEAF code reports each client's group at every evaluation). A client
    never selected has no estimate of its own, and one made from the random initial models would say nothing about
    the trained ones, so an evaluation estimates it as it would a newcomer's. The pass over every client's training
    split (k models) is the evaluation's cost: it runs only in evaluated rounds (the start line says so), so a
    cross-device run sets `eval_every` to what it can afford. Between evaluations the logged cluster of a client
    is the one it last trained or was evaluated with. With every client in every round this is the reassignment
    after every aggregation the class made before, number for number.

    Args:
        num_clusters: k, known in advance.
        warmup_rounds: optional warm start: train one shared model (FedAvg) for this many rounds, then seed
            the k cluster models with the trained models of k clients chosen farthest apart (farthest-first
            traversal on the cosine distances of their last updates). 0 = the paper's independent random
            initializations.
        participation: share of clients per round.
    """

    plan = Plan(holds_updates=True)  # the warm-up seeds the clusters with chosen clients' models

    def __init__(self, num_clusters: int = 2, warmup_rounds: int = 0, participation: float = 1.0) -> None:
        super().__init__(participation)
        if num_clusters < 1 or warmup_rounds < 0:
            raise ValueError("IFCA needs num_clusters >= 1 and warmup_rounds >= 0")
        self.num_clusters, self.warmup_rounds = num_clusters, warmup_rounds
        self.seeded = False  # whether the k cluster models exist (after the warm-up)
        self.everyone_after = -1  # the round after whose aggregation every client estimated its cluster

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.cohort.declare_every_client_work(
            "every client picks its cluster by loss in each evaluated round (federation.eval_every)"
        )
        if not self.warmup_rounds:
            seeds = server.random.rng(0, "cluster-inits").integers(2**31, size=self.num_clusters)
            inits = [server.model.initial_params] + [server.model.random_params(int(seed)) for seed in seeds[1:]]
            self.models = torch.stack(inits)
            self.seeded = True

    def begin_round(self, round: int) -> None:
        """The round's clients estimate their clusters under the models they receive (unless every client just did,
        after the last round's aggregation: the models have not changed since)."""
        if self.seeded and self.everyone_after != round - 1:
            self.pick_clusters(self.select_clients(round))

    def pick_clusters(self, clients: list[int]) -> None:
        """Each of `clients` joins the cluster model with the lowest loss on its training data."""
        every = len(clients) == self.server.num_clients
        losses = self.server.clients.losses(self.models, "train", None if every else clients)
        self.assignment[torch.as_tensor(clients, device=self.assignment.device)] = losses.argmin(dim=0)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        super().aggregate(round, updates)
        if round == self.warmup_rounds and self.warmup_rounds:
            trained = updates.all()
            self.models = trained.params[self.farthest_first(trained.delta_rows())].clone()
            self.seeded = True

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """In an evaluated round, every client estimates its cluster under the new models (see the class doc)."""
        if self.seeded and self.server.run.evaluates(round):
            self.pick_clusters(list(range(self.server.num_clients)))
            self.everyone_after = round

    def farthest_first(self, deltas: torch.Tensor | Differences) -> list[int]:
        """k row indices: start from the update farthest from the rest on average, then repeatedly the one
        farthest from those chosen (`Differences`: the updates read a block at a time, never held whole)."""
        distance = cosine_distance_matrix(deltas)
        chosen = [int(distance.mean(dim=1).argmax())]
        while len(chosen) < min(self.num_clusters, len(deltas)):
            chosen.append(int(distance[:, chosen].min(dim=1).values.argmax()))
        return chosen

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy() if self.seeded else None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seeded": self.seeded, "everyone_after": self.everyone_after}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.seeded = state["seeded"]
        self.everyone_after = state.get("everyone_after", -1)  # absent from checkpoints before it
