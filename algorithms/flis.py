"""FLIS: clustered FL by inference similarity (Morafah, Vahidian, Wang, Lin: "FLIS: Clustered Federated Learning via
Inference Similarity for Non-IID Data Distribution", sections 2.1-2.2, Algorithms 1-3).

The server runs each trained client model on its unlabelled public data; two clients are similar when their
models predict the same class on many public samples (section 2.2's A_ij with the inner product <B_i, B_j>_F
for the printed ||B_i ⊙ B_j||_F, as the authors' code computes it: the Frobenius cosine of
one-hot prediction matrices, i.e. the agreement rate; `soft` uses softmax outputs).

- `FlisDC`: every round, each participant i gets the cluster {j : A_ij >= beta} (overlapping, one per
  participant), averaged by data size into a pool of models that replaces the last one. A client starts from
  the pool model with the lowest loss on its own data.
- `FlisHC`: once, all clients train from the initial model (phase 0); complete-linkage agglomerative
  clustering of 1 - A with threshold tau = 1 - beta fixes disjoint clusters, whose models all restart from
  the initial model; then cluster-wise FedAvg.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, ClientState, Newcomers, RoundUpdates
from fedlight.cluster.clusterers import Agglomerative
from fedlight.cluster.similarity import agreement_similarity


class InferenceSimilarity(Algorithm):
    """What both variants share: inference on the server's public data and the similarity matrix."""

    def __init__(self, beta: float = 0.3, soft: bool = False, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.beta, self.soft = beta, soft

    def setup(self, server) -> None:
        if server.public_x is None:
            raise ValueError(f"{type(self).__name__} needs server public data: set data.init_args.public_size "
                             "(the paper uses 2500 samples)")
        super().setup(server)

    def inferences(self, params: Tensor) -> Tensor:
        """What m flat models infer on the public data: (m, samples) predicted classes, or (m, samples, classes)
        softmax outputs with `soft`."""
        outputs = torch.stack([self.server.predict(p, self.server.public_x) for p in params])
        return outputs.softmax(dim=-1) if self.soft else outputs.argmax(dim=-1)

    def similarity(self, params: Tensor) -> Tensor:
        """(m, m) inference similarity of m flat models on the public data."""
        return agreement_similarity(self.inferences(params), soft=self.soft)


class FlisDC(InferenceSimilarity):
    """FLIS with dynamic overlapping clusters.

    Args:
        beta: similarity threshold of cluster membership (0 = FedAvg over participants, 1 = alone).
        soft: similarity of softmax outputs instead of one-hot predictions.
        selection_split: the client data that picks the starting pool model by lowest loss ("val" by default,
            which keeps the choice off the test data; the paper's code used "test").
        evaluate: "local" evaluates each client's own latest trained model (the paper's metric); "pool" the
            pool model it would start from now. A client that has not trained yet is evaluated with the pool
            model in both cases.
        participation: share of clients per round (the paper: 0.1 of 100).
    """

    holds_updates = True  # compares every participant's model on the public data
    own_aggregation = True  # each participant's similar peers form its pool model

    def __init__(self, beta: float = 0.3, soft: bool = False, selection_split: Literal["train", "val", "test"] = "val",
                 evaluate: Literal["local", "pool"] = "local", participation: float = 1.0) -> None:
        super().__init__(beta, soft, participation)
        self.selection_split, self.evaluate = selection_split, evaluate
        self.local_models: ClientState | None = None

    def setup(self, server) -> None:
        super().setup(server)
        empty = np.flatnonzero(server.split(self.selection_split).sizes() == 0)
        if len(empty):
            raise ValueError(f"FlisDC picks each client's starting model by its loss on the client's "
                             f"{self.selection_split!r} split, but {len(empty)} of {server.num_clients} clients "
                             f"have no {self.selection_split!r} samples (clients {empty[:10].tolist()}): raise "
                             f"data.init_args.{self.selection_split}_fraction, or set "
                             "algorithm.init_args.selection_split: train")
        if self.evaluate == "local":  # a client that has not trained yet reads its pool model
            self.local_models = server.client_state("local_models",
                                                    initial=lambda clients: self.models[self.assignment[clients]])

    def assign_to_pool(self) -> None:
        """Every client starts from the pool model with the lowest loss on its selection split."""
        self.assignment = self.server.client_losses(self.models, self.selection_split).argmin(dim=0)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The new pool: for each participant i, the size-weighted mean of the models of {j : A_ij >= beta}; the
        participants' inference similarity is logged."""
        updates = updates.all()
        similarity = self.similarity(updates.params)
        self.log_matrix("inference_similarity", similarity)
        member = (similarity >= self.beta).to(updates.params.dtype)
        weights = member * updates.num_samples.to(updates.params.dtype)[None, :]
        self.models = (weights / weights.sum(dim=1, keepdim=True)) @ updates.params
        if self.local_models is not None:
            self.local_models.write(updates.clients, updates.params)

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """Every client moves to the new pool model with the lowest loss on its data (once per round)."""
        self.assign_to_pool()

    def evaluation_models(self) -> tuple[Tensor | ClientModels, Tensor]:
        if self.local_models is None:
            return self.models, self.assignment
        n = self.server.num_clients
        return ClientModels(self.local_models.__getitem__, n), torch.arange(n, device=self.models.device)

    def round_metrics(self) -> dict[str, float]:
        return {"cluster/pool_size": float(len(self.models))}


class FlisHC(InferenceSimilarity):
    """FLIS with one hierarchical clustering after an all-client phase 0 (run in round 1, as part of it).

    Args:
        beta: the DC threshold; the clustering distance threshold is tau = 1 - beta unless `tau` is given.
        tau: distance threshold of the agglomerative clustering of 1 - A.
        linkage: "complete" (every pair in a cluster has A >= 1 - tau, matching DC's rule) or "average".
        soft: similarity of softmax outputs instead of one-hot predictions.
        phase_zero_epochs: local epochs of the phase-0 training (default: the federation's). Phase 0 is a
            set-up step outside the round budget (our reading of Algorithm 3, whose loop
            starts at t = 0 but clusters "if t = 1"); its models must be trained enough for their
            predictions to differ by data (the paper trains E = 10 epochs).
        participation: share of clients per round after phase 0 (a run with `federation.clients_per_round` below
            the clients is refused: phase 0 trains every client).
    """

    def __init__(self, beta: float = 0.3, tau: float | None = None,
                 linkage: Literal["complete", "average", "single"] = "complete", soft: bool = False,
                 phase_zero_epochs: int | None = None, participation: float = 1.0) -> None:
        super().__init__(beta, soft, participation)
        self.tau = 1 - beta if tau is None else tau
        self.linkage, self.phase_zero_epochs = linkage, phase_zero_epochs
        self.clustered = False
        self.phase_zero_inferences: Tensor | None = None  # every client's phase-0 inferences (to place newcomers)

    def setup(self, server) -> None:
        super().setup(server)
        server.needs_every_client(type(self).__name__, "in its phase 0 (round 1)")

    def begin_round(self, round: int) -> None:
        if not self.clustered:
            self.phase_zero()

    def phase_zero(self) -> None:
        """Every client trains the initial model once (round index 0); the similarity of the results fixes the
        clusters; every cluster model restarts from the initial model."""
        n = self.server.num_clients
        trained = self.server.train_many(0, list(range(n)), self.server.initial_params.expand(n, -1),
                                         epochs=self.phase_zero_epochs).params
        self.phase_zero_inferences = self.inferences(trained)
        similarity = agreement_similarity(self.phase_zero_inferences, soft=self.soft).cpu().numpy()
        self.log_matrix("inference_similarity", similarity)
        distance = 1 - similarity
        labels = Agglomerative(distance_threshold=self.tau, linkage=self.linkage).fit_predict(distance,
                                                                                             kind="distance")
        self.assignment = torch.as_tensor(labels, device=self.models.device)
        self.models = self.server.initial_params.repeat(int(labels.max()) + 1, 1)
        self.clustered = True

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, Tensor | None]:
        """A newcomer does its phase-0 work (training the initial model) and joins the cluster whose members' phase-0
        models agree most with its own on the public data, on average: the inference similarity the clusters were
        cut by, compared like for like (the phase-0 inferences are kept for it)."""
        if not self.clustered or self.phase_zero_inferences is None:
            return super().newcomer_models(newcomers)
        start, count = self.server.initial_params, newcomers.count
        own = self.inferences(newcomers.train_many(list(range(count)), start.expand(count, -1), self.phase_zero_epochs))
        similarity = agreement_similarity(torch.cat([own, self.phase_zero_inferences]), soft=self.soft)[:count, count:]
        members = F.one_hot(self.assignment, len(self.models)).to(similarity.dtype)  # (clients, clusters)
        placed = (similarity @ members / members.sum(dim=0)).argmax(dim=1)  # mean similarity to each cluster
        return self.models, placed, placed

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy() if self.clustered else None

    def state_dict(self) -> dict:
        return {**super().state_dict(), "clustered": self.clustered,
                "phase_zero_inferences": self.phase_zero_inferences}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.clustered = state["clustered"]
        self.phase_zero_inferences = state.get("phase_zero_inferences")  # absent from checkpoints before it
