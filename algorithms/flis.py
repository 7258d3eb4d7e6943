"""FLIS: clustered FL by inference similarity (Morafah, Vahidian, Wang, Lin: "FLIS: Clustered Federated Learning via
Inference Similarity for Non-IID Data Distribution", sections 2.1-2.2, Algorithms 1-3).

The server runs each trained client model on its unlabelled public data; two clients are similar when their
models predict the same class on many public samples (section 2.2's A_ij with the inner product <B_i, B_j>_F
for the printed ||B_i ⊙ B_j||_F, as the authors' code computes it: the Frobenius cosine of
one-hot prediction matrices, i.e. the agreement rate; `soft` uses softmax outputs).

- `FlisDC`: every round, each participant i gets the cluster {j : A_ij >= beta} (overlapping, one per
  participant), averaged by data size into a pool of models that replaces the last one. A client of a round starts
  from the pool model with the lowest loss on its own data, picked at the start of the round (only the round's clients
  try the pool, as in the paper's DC algorithm and the authors' code).
- `FlisHC`: once, all clients train from the initial model (phase 0); complete-linkage agglomerative
  clustering of 1 - A with threshold tau = 1 - beta fixes disjoint clusters, whose models all restart from
  the initial model; then cluster-wise FedAvg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, ClientState, GroupModels, Newcomers, Plan, RoundUpdates
from fedlight.cluster.clusterers import Agglomerative
from fedlight.cluster.similarity import agreement_similarity

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def distinct_rows(rows: Tensor) -> tuple[Tensor, Tensor]:
    """(the distinct rows of `rows` in order of first appearance, for each row the index of its equal among them):
    participants with the same similar peers get the same pool model, whose loss needs one pass over the clients'
    rows, not one a copy (equal rows have equal losses, so the pick by lowest loss, first on ties, is unchanged)."""
    sums = rows.sum(dim=1, dtype=torch.float64).tolist()  # a cheap fingerprint: only rows of equal sums are compared
    first: list[int] = []
    copy_of: list[int] = []
    for i, total in enumerate(sums):
        equal = next((k for k, j in enumerate(first) if sums[j] == total and torch.equal(rows[i], rows[j])), None)
        if equal is None:
            first.append(i)
            equal = len(first) - 1
        copy_of.append(equal)
    return rows if len(first) == len(rows) else rows[first], torch.tensor(copy_of)


class InferenceSimilarity(Algorithm):
    """What both variants share: inference on the server's public data and the similarity matrix."""

    def __init__(self, beta: float = 0.3, soft: bool = False, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not 0 <= beta <= 1:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.beta, self.soft = beta, soft

    def setup(self, server: ServerContext) -> None:
        if server.data.public_x is None:
            raise ValueError(
                f"{type(self).__name__} needs server public data: set data.init_args.public_size "
                "(the paper uses 2500 samples)"
            )
        super().setup(server)

    def inferences(self, params: Tensor) -> Tensor:
        """What m flat models infer on the public data: (m, samples) predicted classes, or (m, samples, classes)
        softmax outputs with `soft`."""
        public = self.server.data.public_x
        assert public is not None  # `setup` refuses a run without public data
        outputs = torch.stack([self.server.model.predict(p, public) for p in params])
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

    Which pool model a client starts from is picked at the start of each round by the round's clients only, so a
    round's loss passes cover the cohort's rows (10 of 3,400 writers), not every client's. A client evaluated with
    a pool model (every client under "pool"; under "local", one that has not trained yet) picks it by loss in each
    evaluated round (`federation.eval_every`, and the last), after aggregation: the model it would start from now,
    as the `evaluate` option says, rather than one picked from an older pool (or, never selected, from none). That
    pass over those clients' selection splits is the evaluation's cost, in evaluated rounds only (the start line
    says so). With every client in every round it is the reassignment after every aggregation the class made
    before, number for number.
    """

    plan = Plan(holds_updates=True)  # compares every participant's model on the public data

    def __init__(
        self,
        beta: float = 0.3,
        soft: bool = False,
        selection_split: Literal["train", "val", "test"] = "val",
        evaluate: Literal["local", "pool"] = "local",
        participation: float = 1.0,
    ) -> None:
        super().__init__(beta, soft, participation)
        self.selection_split, self.evaluate = selection_split, evaluate
        self.local_models: ClientState | None = None
        self.everyone_after = -1  # the round after whose aggregation every client picked its pool model

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        empty = np.flatnonzero(server.clients.split(self.selection_split).sizes() == 0)
        if len(empty):
            raise ValueError(
                f"FlisDC picks each client's starting model by its loss on the client's "
                f"{self.selection_split!r} split, but {len(empty)} of {server.num_clients} clients "
                f"have no {self.selection_split!r} samples (clients {empty[:10].tolist()}): raise "
                f"data.init_args.{self.selection_split}_fraction, or set "
                "algorithm.init_args.selection_split: train"
            )
        evaluated = "every client" if self.evaluate == "pool" else "every client that has not trained yet"
        server.cohort.declare_every_client_work(
            f"{evaluated} picks its pool model by loss in each evaluated round (federation.eval_every)"
        )
        if self.evaluate == "local":  # a client that has not trained yet reads its pool model
            self.local_models = server.state.declare(
                "local_models", initial=lambda clients: self.models[self.assignment[clients]]
            )

    def begin_round(self, round: int) -> None:
        """The round's clients pick their starting pool models (unless every client just did, after the last
        round's aggregation: the pool has not changed since)."""
        if self.everyone_after != round - 1:
            self.pick_pool_models(self.select_clients(round))

    def pick_pool_models(self, clients: list[int]) -> None:
        """Each of `clients` starts from the pool model with the lowest loss on its selection split (the only model,
        without a loss, when the pool has one: round 1's)."""
        index = torch.as_tensor(clients, device=self.assignment.device)
        if len(self.models) == 1:
            self.assignment[index] = 0
            return
        every = len(clients) == self.server.num_clients
        distinct, copy_of = distinct_rows(self.models)
        losses = self.server.clients.losses(distinct, self.selection_split, None if every else clients)
        self.assignment[index] = losses[copy_of.to(losses.device)].argmin(dim=0)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The new pool: for each participant i, the size-weighted mean of the models of {j : A_ij >= beta}; the
        participants' inference similarity is logged."""
        held = updates.all()
        similarity = self.similarity(held.params)
        self.log_matrix("inference_similarity", similarity)
        member = (similarity >= self.beta).to(held.params.dtype)
        weights = member * held.num_samples.to(held.params.dtype)[None, :]
        self.models = (weights / weights.sum(dim=1, keepdim=True)) @ held.params
        if self.local_models is not None:
            self.local_models.write(held.clients, held.params)

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """In an evaluated round, every client evaluated with a pool model picks it from the new pool (see the
        class doc)."""
        if not self.server.run.evaluates(round):
            return
        n = self.server.num_clients
        if self.local_models is None:
            self.pick_pool_models(list(range(n)))
            self.everyone_after = round
            return
        untrained = torch.ones(n, dtype=torch.bool)
        untrained[self.local_models.touched().cpu()] = False
        if untrained.any():
            self.pick_pool_models(untrained.nonzero().flatten().tolist())

    def evaluation_models(self) -> tuple[Tensor | ClientModels, Tensor]:
        if self.local_models is None:
            return self.models, self.assignment
        n = self.server.num_clients
        return ClientModels(self.local_models.__getitem__, n), torch.arange(n, device=self.models.device)

    def round_metrics(self) -> dict[str, float]:
        return {"cluster/pool_size": float(len(self.models))}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "everyone_after": self.everyone_after}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.everyone_after = state.get("everyone_after", -1)  # absent from checkpoints before it


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

    def __init__(
        self,
        beta: float = 0.3,
        tau: float | None = None,
        linkage: Literal["complete", "average", "single"] = "complete",
        soft: bool = False,
        phase_zero_epochs: int | None = None,
        participation: float = 1.0,
    ) -> None:
        super().__init__(beta, soft, participation)
        self.tau = 1 - beta if tau is None else tau
        self.linkage, self.phase_zero_epochs = linkage, phase_zero_epochs
        self.clustered = False
        self.phase_zero_inferences: Tensor | None = None  # every client's phase-0 inferences (to place newcomers)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.cohort.needs_every_client(type(self).__name__, "in its phase 0 (round 1)")

    def begin_round(self, round: int) -> None:
        if not self.clustered:
            self.phase_zero()

    def phase_zero(self) -> None:
        """Every client trains the initial model once (round index 0); the similarity of the results fixes the
        clusters; every cluster model restarts from the initial model."""
        n = self.server.num_clients
        trained = self.server.clients.train_many(
            0, list(range(n)), self.server.model.initial_params.expand(n, -1), epochs=self.phase_zero_epochs
        ).params
        self.phase_zero_inferences = self.inferences(trained)
        similarity = agreement_similarity(self.phase_zero_inferences, soft=self.soft).cpu().numpy()
        self.log_matrix("inference_similarity", similarity)
        distance = 1 - similarity
        labels = Agglomerative(distance_threshold=self.tau, linkage=self.linkage).fit_predict(distance, kind="distance")
        self.assignment = torch.as_tensor(labels, device=self.models.device)
        self.models = self.server.model.initial_params.repeat(int(labels.max()) + 1, 1)
        self.clustered = True

    def newcomer_models(self, newcomers: Newcomers) -> tuple[GroupModels, Tensor, Tensor | None]:
        """A newcomer does its phase-0 work (training the initial model) and joins the cluster whose members' phase-0
        models agree most with its own on the public data, on average: the inference similarity the clusters were
        cut by, compared like for like (the phase-0 inferences are kept for it)."""
        if not self.clustered or self.phase_zero_inferences is None:
            return super().newcomer_models(newcomers)
        start, count = self.server.model.initial_params, newcomers.count
        own = self.inferences(newcomers.train_many(list(range(count)), start.expand(count, -1), self.phase_zero_epochs))
        similarity = agreement_similarity(torch.cat([own, self.phase_zero_inferences]), soft=self.soft)[:count, count:]
        members = F.one_hot(self.assignment, len(self.models)).to(similarity.dtype)  # (clients, clusters)
        placed = (similarity @ members / members.sum(dim=0)).argmax(dim=1)  # mean similarity to each cluster
        return self.models, placed, placed

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy() if self.clustered else None

    def state_dict(self) -> dict:
        return {
            **super().state_dict(),
            "clustered": self.clustered,
            "phase_zero_inferences": self.phase_zero_inferences,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.clustered = state["clustered"]
        self.phase_zero_inferences = state.get("phase_zero_inferences")  # absent from checkpoints before it
