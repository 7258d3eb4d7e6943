"""ICFL ("Clustered Federated Learning in Heterogeneous Environment", Yihan Yan, Xiaojun Tong and Shen Wang, IEEE
TNNLS 2023, doi 10.1109/TNNLS.2023.3264740), as FedRC's baseline set runs it: clients start in one pool cluster S0;
a cluster whose members' updates stop agreeing (the top singular value of their cosine-similarity matrix, per
member, falls below a threshold that rises over the rounds) is split in two by k-means on the top two singular
vectors; once clusters exist, a pool client joins the most similar one when it is sampled (incremental clustering).

The paper's text was not at hand (closed access; its title, authors and venue are confirmed by its DOI record). Every
rule below is the one FedRC's authors ship for this baseline (LINs-lab/FedRC: `aggregator.py`, `ICFLAggregator.mix`,
`find_c_true`, `update_clients`; `client.py`'s `Client.step`, which returns the client's update, trained minus start,
on the parameters). As that code runs it, in each round:
- similarity: the cosine-similarity matrix A of a cluster's members' updates (for S0 before any split: its sampled
  clients'); its singular values lambda_1 >= lambda_2 >= ... and alpha_G = lambda_1 / m, m the members (alpha_G = 1
  for a single member). A = all ones (identical directions) gives 1; two orthogonal blocks of a and b members give
  max(a, b) / m;
- threshold: alpha_t = 1 - (e / epsilon_1) ^ (t / epsilon_2), epsilon_2 = ln(1 - alpha_0) / (1 - ln epsilon_1), t the
  rounds before this one (0 in the first). With the defaults epsilon_1 4.0 and alpha_0 0.85 (the code's),
  epsilon_2 = 4.911: alpha_t is 0 in round 1, 0.076 in round 2, 0.51 in round 10, 0.91 in round 31, and reaches
  alpha_0 after epsilon_2^2 = 24.1 rounds (round 25). It rises towards 1, so in the long run a cluster splits unless
  its members' updates point the same way;
- split: when alpha_G < alpha_t (and m >= 2), k-means with 2 clusters on the rows of the top two singular vectors
  (optionally only when each half keeps `min_cluster_size` of the round's members: not in the paper or the code);
  S0 keeps its clients not sampled and both halves become clusters, a cluster k is replaced by its two halves;
- incremental clustering: once clusters exist, S0 is never split again; its sampled clients train S0's model and
  then join a cluster (their trained models count in that cluster's mean, and in its split test);
- aggregation: each cluster model is the training-set-size weighted mean of its members' trained models; S0's model
  is the weighted mean of its sampled clients' models and the cluster models (each weighted by its members' total
  training-set size): before any split, FedAvg of the sampled pool; after, the global mean of the clusters, which
  new pool clients train from.
Defaults: epsilon_1 4.0, alpha_0 0.85 (the code's). Refused: epsilon_1 <= e and alpha_0 outside (0, 1). The threshold
is 1 - exp(t (1 - ln epsilon_1)^2 / ln(1 - alpha_0)), so epsilon_1 and e^2 / epsilon_1 give the same schedule and e
leaves it at 0 (epsilon_2 divides by zero): asking for more than e loses no schedule and keeps epsilon_2 positive;
alpha_0 at 0 makes epsilon_2 0, at 1 or above ln(1 - alpha_0) undefined, below 0 a threshold falling below 0.
Clients held out of training (the code's test clients) get the model, S0's included, of the lowest loss on their
data (the base class's rule, on their training split; the code uses their validation split).

Bugs in the code, and what is done here instead (the paper's evident intent):
- `find_c_true` never updates its running maximum (`max` stays -1.5), so every pool client joins the last cluster;
  it also compares the client's update with the cluster model's parameters (a direction against a point), and reads
  `.learner[0]` of an ensemble that has `.learners`, an AttributeError the code never reaches with every client
  sampled (S0 is then empty after its split). Here a pool client joins the cluster whose direction from S0's model
  (the clusters' mean) is nearest in cosine to its own update from that model, the rule OCFL and CFL use for
  newcomers (`fedlight.plugin.nearest_direction`, behind `nearest_update_direction`);
- `q = q[:2]` takes the first two rows of V from `torch.svd`, not its first two columns (the singular vectors), so
  member i is placed at the first two coordinates of the i-th singular vector. Here the embedding is the top two
  singular vectors (member i at (v_1[i], v_2[i])), the spectral embedding;
- when S0 does not split before clusters exist, the code keeps only its sampled clients in S0, so with partial
  participation the unsampled ones belong to no cluster and are never trained again. Here they stay in S0;
- clients train from the model they last received (`update_clients` copies the new model only to the round's
  sampled clients), so a client sampled again trains a stale copy of its cluster model. Here every client trains its
  cluster's current model.

Deviations (choices of fedlight, each the same as the code when every client trains every round):
- the round's clients are the run's draw (`participation`, or `federation.clients_per_round`, or the system model's
  selection), uniform over all clients; the code draws int(rate x size) from each cluster, the same expected number
  a cluster, but none ever from a cluster with fewer than 1 / rate members;
- a cluster's split test and its mean cover its members of the round; the code's A covers every member with its
  last update (stale for the ones not sampled) and its mean every member's model (the cluster model it last
  received, for one not sampled). So a round's work grows with its clients, not with the clusters' sizes;
- a cluster split on its round members sends its members not sampled back to S0, from which each joins the more
  similar half when next sampled (the code splits every member on its stale update);
- the means are the engine's cluster aggregator (a robust rule or DP when the run configures one); S0's model after
  the first split is computed from the cluster models alone (no client's update), weighted by training-set sizes;
- k-means is scikit-learn's with 10 restarts, seeded by (seed, round); the code's runs unseeded.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from sklearn.cluster import KMeans
from torch import Tensor

from fedlight.cluster.similarity import cosine_similarity_matrix
from fedlight.plugin import Algorithm, Plan, RoundUpdates, nearest_direction

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

POOL = 0  # the row of `models` holding S0's model; the clusters are rows 1..


def epsilon_2(epsilon_1: float, alpha_0: float) -> float:
    """The threshold's time constant: ln(1 - alpha_0) / (1 - ln epsilon_1)."""
    return math.log(1 - alpha_0) / (1 - math.log(epsilon_1))


def split_threshold(rounds_before: int, epsilon_1: float, alpha_0: float) -> float:
    """alpha_t = 1 - (e / epsilon_1) ^ (t / epsilon_2) after t rounds: 0 at t = 0, rising towards 1."""
    return 1 - (math.e / epsilon_1) ** (rounds_before / epsilon_2(epsilon_1, alpha_0))


def cohesion(similarity: Tensor) -> float:
    """alpha_G = lambda_1 / m for an (m, m) similarity matrix (1 for a single member)."""
    m = len(similarity)
    if m < 2:
        return 1.0
    return float(torch.linalg.svdvals(similarity.double())[0]) / m


def bipartition(similarity: Tensor, seed: int) -> np.ndarray:
    """Labels 0/1 of the m >= 2 members: k-means (2 clusters) on the rows of the top two right singular vectors."""
    _, _, vh = torch.linalg.svd(similarity.double().cpu())
    embedding = vh[:2].T.numpy()  # member i at (v_1[i], v_2[i])
    return KMeans(n_clusters=2, n_init=10, random_state=seed).fit_predict(embedding)


class ICFL(Algorithm):
    """Clusters split in two when their members' updates stop agreeing (against a threshold that rises over the
    rounds); clients not yet clustered join the most similar cluster when sampled.

    Args:
        epsilon_1: the threshold's base e / epsilon_1: above e (2.718...); larger makes alpha_t rise faster.
        alpha_0: in (0, 1): the threshold reaches it after epsilon_2^2 rounds.
        min_cluster_size: a split is made only when each half has at least this many of the round's members (None:
            no floor, as the authors' code). The threshold rises towards 1, so in a long run clusters keep splitting
            down to single clients once their members' updates stop agreeing at round-to-round noise; a floor (the
            smallest true cluster one expects) stops that.
        participation: share of clients per round (or the federation's `clients_per_round`).
    """

    plan = Plan(holds_updates=True)  # the split test compares every pair of a cluster's round members' updates

    def __init__(
        self,
        epsilon_1: float = 4.0,
        alpha_0: float = 0.85,
        min_cluster_size: int | None = None,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if not epsilon_1 > math.e:
            raise ValueError(
                f"algorithm.init_args.epsilon_1 must be above e (2.718...), got {epsilon_1}: give 4.0, "
                "the code's (e leaves the threshold at 0; below e, the threshold of e^2 / epsilon_1)"
            )
        if not 0 < alpha_0 < 1:
            raise ValueError(
                f"algorithm.init_args.alpha_0 must be in (0, 1), got {alpha_0}: give 0.85, the code's "
                "(ln(1 - alpha_0) is the threshold's scale)"
            )
        if min_cluster_size is not None and min_cluster_size < 1:
            raise ValueError(
                f"algorithm.init_args.min_cluster_size must be at least 1, or null for no floor, got {min_cluster_size}"
            )
        self.epsilon_1, self.alpha_0, self.min_cluster_size = epsilon_1, alpha_0, min_cluster_size
        self.split_rounds: list[int] = []

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.entries = server.model.parameter_mask()  # updates are compared on the parameters, as the code's

    # -- clustering ------------------------------------------------------------------------------------------
    def pre_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """Pool clients join their nearest cluster (once clusters exist); then each cluster with members in the
        round (S0 before any split) is tested and split."""
        held = updates.all()
        changes = held.delta_rows(self.entries)
        alpha_t = split_threshold(round - 1, self.epsilon_1, self.alpha_0)
        self.log("cluster/alpha_t", alpha_t)
        rows = self.assignment[held.clients]
        if len(self.models) > 1:
            pooled = (rows == POOL).nonzero().flatten()
            if len(pooled):
                self.join(held.clients[pooled], changes[pooled])
            rows = self.assignment[held.clients]
        least = 1.0
        for cluster in rows.unique().tolist():
            if cluster == POOL and len(self.models) > 1:
                continue
            members = (rows == cluster).nonzero().flatten()
            if len(members) < 2:
                continue
            similarity = cosine_similarity_matrix(changes[members])
            alpha_g = cohesion(similarity)
            least = min(least, alpha_g)
            if alpha_g < alpha_t:
                seed = int(self.server.random.rng(round, f"icfl-split-{cluster}").integers(2**31))
                halves = bipartition(similarity, seed)
                if self.min_cluster_size is None or min(np.bincount(halves, minlength=2)) >= self.min_cluster_size:
                    self.split(round, cluster, held.clients[members], halves)
        self.log("cluster/alpha_G_min", least)  # the least cohesive cluster tested (1: none had two members)

    def join(self, clients: Tensor, changes: Tensor) -> None:
        """Each pool client joins the cluster whose direction from S0's model is nearest to its update from it."""
        directions = (self.models[1:] - self.models[POOL])[:, self.entries]
        self.assignment[clients] = nearest_direction(changes.to(directions.dtype), directions) + 1

    def split(self, round: int, cluster: int, clients: Tensor, labels: np.ndarray) -> None:
        """Split `cluster` by `labels` of its round members `clients`: S0's halves both become new clusters; a
        cluster keeps its row for half 0 and half 1 gets a new one, its members not in the round return to S0."""
        halves = [clients[torch.as_tensor(labels == half, device=clients.device)] for half in (0, 1)]
        if not all(len(half) for half in halves):
            return
        if cluster != POOL:
            self.assignment[self.assignment == cluster] = POOL
        for i, half in enumerate(halves):
            row = cluster if cluster != POOL and i == 0 else len(self.models)
            if row == len(self.models):
                self.models = torch.cat([self.models, self.models[cluster : cluster + 1]])
            self.assignment[half] = row
        self.split_rounds.append(round)

    # -- aggregation -----------------------------------------------------------------------------------------
    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Each cluster with round members: their weighted mean (the engine's aggregator); S0's model, once clusters
        exist: the clusters' models weighted by their members' training-set sizes."""
        held = updates.all()
        self.set_shared(*self.cluster_means(held, held.num_samples.to(self.models.dtype)))
        if len(self.models) > 1:
            sizes = torch.bincount(
                self.assignment,
                weights=self.server.clients.train_sizes.to(self.assignment.device).double(),
                minlength=len(self.models),
            )[1:].to(self.models)
            self.models[POOL] = sizes @ self.models[1:] / sizes.sum()

    # -- state -----------------------------------------------------------------------------------------------
    def cluster_labels(self) -> np.ndarray:
        return self.assignment.cpu().numpy()

    def round_metrics(self) -> dict[str, float]:
        return {
            "cluster/count": float(len(self.models) - 1),
            "cluster/pool": float((self.assignment == POOL).sum()),
            "cluster/clustered_round": float(self.split_rounds[-1] if self.split_rounds else 0),
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "split_rounds": list(self.split_rounds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.split_rounds = list(state["split_rounds"])
