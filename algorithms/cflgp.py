"""CFL-GP ("Clustered Federated Learning via Gradient-based Partitioning", Heasung Kim, Hyeji Kim and Gustavo de
Veciana, ICML 2024): every client's updates at a set of models are accumulated over rounds into a gradient profile,
spectral clustering of the profiles partitions the clients into K clusters, and each cluster averages its members'
updates.

Every rule below is cited from the authors' implementation (the paper's text beyond its abstract, "clustering the
gradients that clients compute for various models", was not at hand). As that code runs it
(Heasung-Kim/clustered-federated-learning-via-gradient-based-partitioning: learning_agent/central_unit.py
`run_CFLGP`, learning_agent/utils.py `spectral_clustering_and_matching` and `get_num_cluster`, main.py's defaults):
- query rounds: every `clustering_period` (P) rounds from round 1 up to round `clustering_rounds` (T_c, the code's
  `clustering_termination_threshold`; its 0-based round t clusters when t % P == 0 and t < T_c). In a query round each
  client of the round, besides training its own cluster's model, sends its update at the criterion model, one of the
  K cluster models in turn (the q-th query round's is model q mod K);
- the gradient profile (`gradient_profile_matrix`, here a client state: K blocks per client, block k its accumulated
  update at model k) takes the query as G_k <- (1 - beta) G_k + beta g with beta = 1 / (the block's visits, this one
  included): the running mean, which is what the code's `1 / (floor((t + 1) / (K P)) + 1)` gives for P >= 2;
  `beta` as a number is a constant step after the block's first visit (which sets it);
- spectral clustering: the top-K left singular vectors P_K of the profile matrix G (one column per client), the
  clients' reduced profiles P_K^T G, k-means on them (scikit-learn, k-means++, 10 restarts, as the code's KMeans with
  the scikit-learn of its time), and the new labels renamed to agree most with the clients' previous ones (the code
  tries every permutation; here the assignment problem on the contingency table, the same maximum up to ties);
- aggregation: each cluster model moves by the unweighted mean of its members' updates (`model_averaging`);
- K unknown (`unknown_k`, the code's `unknown_k` and `warmup_epoch`): rounds 1..W (`warmup_rounds`) train one model
  while the profile accumulates; in round W + 1 the count is chosen as `get_num_cluster` chooses it: r, the number
  of singular values of G before the largest gap (at least 3), then the k in 2..num_clusters whose k-means on the
  r-dimensional reduced profiles has the best silhouette; the clustering starts in the next query round.
Defaults: K = 4, P = 2, T_c = 10, beta the running mean, the whole update (main.py).

Deviations:
- the reduced profiles come from the eigenvectors of the Gram matrix G^T G (client by client), which the server keeps
  and recomputes in the rows and columns of each query round's clients: P_K^T G = Sigma_K Q_K^T are the same points
  (up to the signs of coordinates, which k-means ignores), without an SVD of the (K x entries, clients) matrix G;
- the update is the module's local training (the code's `model_averaging` protocol), not one batch's gradient (its
  default `gradient_averaging`, which moves the cluster model by a server SGD step);
- the code's query loop computes every query at the client's own model and keeps the criterion at model 0; here the
  criterion model is trained, and it cycles through the models, as the code's beta presumes and the authors' later
  code (clustered-federated-learning-to-support-context-dependent-csi-decoding) cycles it;
- the K models start at the first clustering from the one model all clients trained until then (the code adds each
  cluster's first mean update to K independent random initializations);
- k-means is seeded from (seed, round), not the code's fixed 42; `warmup_rounds` also delays a known K's clustering
  (as the authors' later code does; the first code reads it only with `unknown_k`);
- queries stop with the clustering after T_c (the code keeps computing them, unused);
- a run with a `privacy:` section is refused: the queries reach the server as they are, outside DP's accounting;
- `compression` > 1 keeps a random 1 / compression of the parameter entries in the profile (the code's
  `use_reduced_G`, which its main.py leaves off): for large models and many clients.

Partial participation (not in the paper, whose clients all take part every round): a client's profile takes the
queries of the rounds it is selected in, with its own visit counts, and a clustering partitions every client seen so
far, from their stored profiles (so the clustering step's work grows with the clients seen, a round's training with
its clients); the new labels are matched on the clients labelled before. A client not yet seen trains and is
evaluated with cluster model 0. A client that arrives after training gets the cluster model with the lowest loss on
its training split (the base class's answer; the paper places none).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score
from torch import Tensor

from fedlight.plugin import PER_CLIENT, Algorithm, Plan, RoundUpdates, Trained, Updates

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

QUERY = "criterion_update"  # what a client sends beside its model in a query round: its update at the criterion model
CHUNK_BYTES = 1 << 28  # stored profiles read at a time when the Gram matrix is updated


def accumulate(block: Tensor, visits: Tensor, fresh: Tensor, beta: float | None) -> Tensor:
    """Profile block k of m clients after one more query: (1 - b) block + b fresh, with b = 1 / visits (the running
    mean; `visits` counts this query) or, with `beta`, b = beta after the first visit, which sets the block."""
    step = 1.0 / visits.to(block.dtype) if beta is None else torch.where(visits == 1, 1.0, beta).to(block.dtype)
    return (1 - step[:, None]) * block + step[:, None] * fresh


def reduced_profiles(gram: Tensor, count: int) -> Tensor:
    """(clients, count) the clients' reduced profiles P^T G from the Gram matrix G^T G of their profiles: the top
    eigenvectors scaled by the square roots of their eigenvalues (G's singular values), in float64."""
    values, vectors = torch.linalg.eigh(0.5 * (gram + gram.T).double())
    top = values.flip(0)[:count].clamp_min(0)
    return vectors.flip(1)[:, :count] * top.sqrt()


def spectral_partition(gram: Tensor, clusters: int, seed: int) -> np.ndarray:
    """Labels 0..k-1 of k-means (k-means++, 10 restarts) on the clients' K-dimensional reduced profiles."""
    points = reduced_profiles(gram, clusters).cpu().numpy()
    k = min(clusters, len(points))
    return KMeans(n_clusters=k, init="k-means++", n_init=10, random_state=seed).fit_predict(points)


def estimate_cluster_count(gram: Tensor, max_clusters: int, seed: int) -> int:
    """The code's `get_num_cluster`: r = the singular values before the largest gap (at least 3), then the k in
    2..max_clusters with the best silhouette of k-means on the r-dimensional reduced profiles (1 with under 3 clients,
    where no two clusterings can be compared)."""
    singular = torch.linalg.eigvalsh(0.5 * (gram + gram.T).double()).flip(0).clamp_min(0).sqrt().cpu().numpy()
    n = len(singular)
    candidates = list(range(2, min(max_clusters, n - 1) + 1))
    if not candidates:
        return 1
    leading = int(np.clip(1 + np.argmax(singular[:-1] - singular[1:]), 3, n))
    points = reduced_profiles(gram, leading).cpu().numpy()
    scores = [
        silhouette_score(points, KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(points))
        for k in candidates
    ]
    return candidates[int(np.argmax(scores))]


def match_labels(new: np.ndarray, old: np.ndarray, known: np.ndarray, num_labels: int) -> np.ndarray:
    """`new` renamed (one label to one label of 0..num_labels-1) to agree with `old` on the most `known` clients."""
    table = np.zeros((int(new.max()) + 1, num_labels))
    np.add.at(table, (new[known], old[known]), 1)
    rows, columns = linear_sum_assignment(table, maximize=True)
    renamed = np.empty(len(table), dtype=np.int64)
    renamed[rows] = columns
    return renamed[new]


def cosine_from_gram(gram: Tensor) -> Tensor:
    """cos(G_i, G_j) of the profiles from their Gram matrix (0 for a profile of zeros)."""
    norms = gram.diagonal().clamp_min(0).sqrt()
    return gram / (norms[:, None] * norms[None, :]).clamp_min(1e-12)


class CFLGP(Algorithm):
    """Spectral clustering of accumulated updates (gradient profiles); FedAvg of updates within each cluster.

    Args:
        num_clusters: K (with `unknown_k`, the largest count considered).
        clustering_period: P, rounds between query rounds (each one also clusters, after the warm-up).
        clustering_rounds: T_c, the last round that may query and cluster (None: every P-th round of the run).
        beta: the accumulation's step; None is the running mean of a block's queries (the code's), a number in (0, 1]
            a constant step (the older queries decay by 1 - beta each visit).
        unknown_k: choose K after the warm-up (eigengap and silhouette), up to num_clusters.
        warmup_rounds: W, rounds of one model (FedAvg) before the clustering starts.
        compression: keep a random 1 / compression of the parameter entries in the profile (1: all of them).
        participation: share of clients per round (the paper trains all).
    """

    plan = Plan(holds_updates=True)  # the query round's profiles are read from every update

    def __init__(
        self,
        num_clusters: int = 4,
        clustering_period: int = 2,
        clustering_rounds: int | None = 10,
        beta: float | None = None,
        unknown_k: bool = False,
        warmup_rounds: int = 0,
        compression: int = 1,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        checks = [
            (
                num_clusters >= (2 if unknown_k else 1),
                "num_clusters",
                num_clusters,
                ">= 2 with unknown_k" if unknown_k else ">= 1",
            ),
            (clustering_period >= 1, "clustering_period", clustering_period, ">= 1"),
            (
                clustering_rounds is None or clustering_rounds >= 1,
                "clustering_rounds",
                clustering_rounds,
                ">= 1 or null",
            ),
            (beta is None or 0 < beta <= 1, "beta", beta, "in (0, 1] or null (the running mean)"),
            (warmup_rounds >= 0, "warmup_rounds", warmup_rounds, ">= 0"),
            (compression >= 1, "compression", compression, ">= 1"),
        ]
        for ok, name, value, wanted in checks:
            if not ok:
                raise ValueError(f"algorithm.init_args.{name} must be {wanted}, got {value!r}")
        self.num_clusters, self.clustering_period, self.clustering_rounds = (
            num_clusters,
            clustering_period,
            clustering_rounds,
        )
        self.beta, self.unknown_k, self.warmup_rounds, self.compression = beta, unknown_k, warmup_rounds, compression
        self.first_clustering = warmup_rounds + 1 + int(unknown_k)  # K is chosen in round W + 1 when unknown
        if clustering_rounds is not None and not any(
            self.queries_in(r) for r in range(self.first_clustering, clustering_rounds + 1)
        ):
            raise ValueError(
                f"algorithm.init_args.clustering_rounds is {clustering_rounds}: no query round from round "
                f"{self.first_clustering} (after the warm-up) on would cluster; raise it or lower "
                f"warmup_rounds"
            )
        self.clusters: int | None = None if unknown_k else num_clusters  # K, once known
        self.queries = 0  # query rounds so far: the next criterion model is queries mod (models)
        self.clustered_round = 0

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        n, device = server.num_clients, server.device
        if self.num_clusters > n:
            raise ValueError(
                f"algorithm.init_args.num_clusters is {self.num_clusters}, more than the {n} clients: give at most {n}"
            )
        server.message.sends(QUERY, PER_CLIENT)  # an update at the criterion model, read into each client's profile
        server.cohort.declare_every_client_work(
            "each clustering partitions every client seen so far, from the "
            "gradient profiles the server stored for them (no training)"
        )
        entries = server.model.parameter_mask().nonzero().flatten()
        if self.compression > 1:
            size = max(1, len(entries) // self.compression)
            keep = server.random.rng(0, "cflgp-profile-entries").choice(len(entries), size, replace=False)
            entries = entries[torch.as_tensor(np.sort(keep), device=entries.device)]
        self.entries = entries
        self.profile = server.state.declare(
            "gradient_profile",
            initial=torch.zeros(
                self.num_clusters, len(entries), dtype=server.model.initial_params.dtype, device=device
            ),
        )
        self.visits = torch.zeros(n, self.num_clusters, dtype=torch.long, device=device)
        self.gram = torch.zeros(n, n, dtype=torch.float64, device=device)  # profiles' inner products, seen clients
        self.seen = torch.zeros(n, dtype=torch.bool, device=device)  # clients with a profile
        self.labelled = torch.zeros(n, dtype=torch.bool, device=device)  # clients some clustering labelled

    def queries_in(self, round: int) -> bool:
        """Whether `round` is a query round: every P-th from round 1, up to T_c."""
        last = self.clustering_rounds
        return (round - 1) % self.clustering_period == 0 and (last is None or round <= last)

    def criterion(self) -> int:
        """The model the clients of the next query round are queried at: each model in turn."""
        return self.queries % len(self.models)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The module's SGD from each client's cluster model; in a query round also from the criterion model for the
        clients of other clusters, whose update there is sent beside the model (`criterion_update`)."""
        trained = super().train_group(round, clients, starts)
        if not self.queries_in(round):
            return trained
        k = self.criterion()
        query = trained.params[:, self.entries] - starts[:, self.entries]
        others = [i for i, c in enumerate(clients) if int(self.assignment[c]) != k]
        if others:
            at = self.models[k].expand(len(others), -1).contiguous()
            elsewhere = self.server.clients.train_many(
                round, [clients[i] for i in others], at, lr_scale=self.learning_rate_scale(round)
            )
            query[others] = elsewhere.params[:, self.entries] - at[:, self.entries]
        trained.state = {**trained.state, QUERY: query}
        return trained

    def pre_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """A query round accumulates the clients' queries into their profiles; after the warm-up it clusters every
        client seen. With K unknown, the round after the warm-up chooses it."""
        if self.queries_in(round):
            self._accumulate(updates.all())
        if self.unknown_k and round == self.warmup_rounds + 1:
            ids = self.seen.nonzero().flatten()
            self.clusters = estimate_cluster_count(self.gram[ids][:, ids], self.num_clusters, self._seed(round))
            self.log("cluster/chosen_k", float(self.clusters))
        elif self.queries_in(round) and round >= self.first_clustering:
            self._cluster(round)

    def _accumulate(self, updates: Updates) -> None:
        """Block `criterion` of the round's clients' profiles takes their queries; their Gram rows are recomputed."""
        clients, k = updates.clients, self.criterion()
        self.log("cluster/criterion_model", float(k))
        self.queries += 1
        rows = self.profile.read(clients)
        self.visits[clients, k] += 1
        rows[:, k] = accumulate(rows[:, k], self.visits[clients, k], updates.state[QUERY].to(rows.dtype), self.beta)
        self.profile.write(clients, rows)
        self.seen[clients] = True
        fresh = rows.flatten(1).double()
        seen = self.seen.nonzero().flatten()
        step = max(1, CHUNK_BYTES // (8 * fresh.shape[1]))
        for begin in range(0, len(seen), step):
            chunk = seen[begin : begin + step]
            block = fresh @ self.profile.read(chunk).flatten(1).double().T
            self.gram[clients[:, None], chunk[None, :]] = block
            self.gram[chunk[:, None], clients[None, :]] = block.T

    def _cluster(self, round: int) -> None:
        """Spectral clustering of every client seen into K clusters, labels matched to the previous ones; the first
        clustering starts the K models from the one model."""
        clusters = self.clusters
        assert clusters is not None  # known from the start, or chosen the round after the warm-up
        ids = self.seen.nonzero().flatten()
        gram = self.gram[ids][:, ids]
        self.log_matrix("gradient_profile_cosine_similarity", cosine_from_gram(gram))
        labels = spectral_partition(gram, clusters, self._seed(round))
        known = self.labelled[ids].cpu().numpy()
        if known.any():
            labels = match_labels(labels, self.assignment[ids].cpu().numpy(), known, clusters)
        if len(self.models) < clusters:
            self.models = self.models[:1].repeat(clusters, 1)
        self.assignment[ids] = torch.as_tensor(labels, dtype=self.assignment.dtype, device=self.assignment.device)
        self.labelled[ids] = True
        self.clustered_round = round

    def _seed(self, round: int) -> int:
        return int(self.server.random.rng(round, "cflgp-kmeans").integers(2**31))

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Each cluster model moves by the unweighted mean of its members' updates (the code's `model_averaging`)."""
        held = updates.all()
        ones = torch.ones_like(held.num_samples, dtype=self.models.dtype)
        active, mean_update = self.cluster_means(held, ones, held.delta_rows())
        self.set_shared(active, self.models[active] + mean_update)

    def cluster_labels(self) -> np.ndarray | None:
        return self.assignment.cpu().numpy()

    def round_metrics(self) -> dict[str, float]:
        return {"cluster/clustered_round": float(self.clustered_round)}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "clusters": self.clusters,
            "queries": self.queries,
            "clustered_round": self.clustered_round,
            "visits": self.visits,
            "gram": self.gram,
            "seen": self.seen,
            "labelled": self.labelled,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clusters, self.queries = state["clusters"], state["queries"]
        self.clustered_round = state["clustered_round"]
        self.visits, self.gram, self.seen, self.labelled = (
            state["visits"],
            state["gram"],
            state["seen"],
            state["labelled"],
        )
