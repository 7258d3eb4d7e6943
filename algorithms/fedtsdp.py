"""FedTSDP ("Federated Two Stage Decoupling With Adaptive Personalization Layers", Zhu, Fan, Xie, 2023,
arXiv:2308.15821): two-stage clustering of the clients, gated by the Hopkins
statistic of their outputs on public data, with a shared-layer count that shrinks at every clustering event.

Algorithm 1 of the paper. One round:

1. every client starts from its cluster's shared layers plus its own personal layers, trains E epochs with the
   learning rate decayed by `lr_decay` per round, and uploads its full model;
2. the server draws one public batch with the sampling weights W, computes every uploaded model's softmax
   outputs on it, and the Hopkins statistic H of the flattened outputs (section 3.2.2, Eq. 6; one batch shared by all
   clients is our reading of Algorithm 1 lines 13-16);
3. if H > `hopkins_threshold`: stage 1 clusters all participants by DBSCAN on the Jensen-Shannon divergence
   of their outputs, stage 2 splits every stage-1 cluster by DBSCAN on the L2 distances of the model weights;
   the clients get fresh cluster ids, W is raised on this batch (Eq. 7-8) (sections 3.2.1-3.3.1, Eq. 3-5
   and 9-10; Algorithm 1 lines 17-27);
4. the shared layers are averaged within each cluster, weighted by training-set size (Algorithm 1 lines 28-30);
5. if the clustering ran, the shared-layer count L^s is multiplied by `psi`; the effective count is L^s on the
   half-layer grid, so the network goes e.g. from 4 shared layers to 3.5 (the last layer's weight shared, its
   bias personal). Tensors that become personal keep each client's own trained values (section 3.3.2, Eq. 11;
   the half-layer grid is our reading of section 4.5's "from 4 to 3.5").

Before the first clustering event everything is shared and FedTSDP is FedAvg (with the decayed learning rate).
The server needs each client's full model, personal layers included (Algorithm 1 line 39 returns the
full w_i; the paper does not discuss it): a privacy cost of the method.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin import Algorithm, Plan, RoundUpdates, half_step
from fedlight.cluster.clusterers import DBSCAN
from fedlight.cluster.hopkins import default_sample_size, hopkins
from fedlight.cluster.similarity import js_divergence_matrix, l2_distance_matrix

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class FedTSDP(Algorithm):
    """Federated two-stage decoupling with adaptive personalization layers. Needs server public data
    (`data.public_size > 0`). Constants marked "paper" are the paper's; "our choice" marks what the paper does not
    state (our choice is the default).

    Args:
        hopkins_threshold: h_th; cluster only when H > h_th (paper: 0.65).
        eps_inference: DBSCAN radius ε1 of stage 1, on the JS divergence, natural log, mean over the public
            batch (paper: 0.15; log base and averaging are our choice).
        eps_weights: DBSCAN radius ε2 of stage 2, on the L2 distance of the weights (paper: 3.5).
        min_points: DBSCAN's minimum points, the point itself included (paper: 2).
        psi: factor applied to L^s at every clustering event (paper: 0.98, a constant, not 0.98^r).
        lr_decay: the local learning rate of round r is the configured one times lr_decay^(r-1) (paper: 0.95).
        public_batch: B, public samples drawn per round, the same batch for every client (our choice: 50).
        hopkins_sample: m̃, points sampled by the Hopkins statistic; None means max(2, ceil(m/4)), at most m
            (our choice).
        rounding: how L^s reaches the half-layer grid: "floor" (3.92 -> 3.5) or "round" (our choice: floor).
        noise: what DBSCAN noise clients become (our choice: "singletons", one cluster each; "nearest" joins
            the cluster of the closest non-noise client; also "nearest_mean", "own_cluster").
        sampling: the public-sample weights' update. "literal": Eq. 7-8 as printed, W[batch] += |D_pub|/B then
            W /= sum(W), so one event puts over 99 % of the mass on that batch; "count": weights are counts
            starting at 1, normalized only to sample (our choice: literal).
        weights: the parameters stage 2 compares: "all" trainable parameters of the uploaded model, or only
            the currently "shared" ones; buffers never (our choice: all).
        stages: "both"; or the ablations "inference" (stage 1 only) and "weights" (stage 2 on all
            participants), keeping the Hopkins gate and the layer schedule (our choice for the ablations).
        initial_shared: L^s before any event; None means every layer (inferred from the paper's Fig. 11).
        participation: δ, the share of clients per round (paper: 1.0).
    """

    plan = Plan(holds_updates=True)  # clusters on every participant's outputs and weights
    #: under FedBuff the shared layers arrive re-based and the personal ones as trained; it clusters the round's
    #: arrivals as it would its participants

    def __init__(
        self,
        hopkins_threshold: float = 0.65,
        eps_inference: float = 0.15,
        eps_weights: float = 3.5,
        min_points: int = 2,
        psi: float = 0.98,
        lr_decay: float = 0.95,
        public_batch: int = 50,
        hopkins_sample: int | None = None,
        rounding: Literal["floor", "round"] = "floor",
        noise: Literal["singletons", "nearest", "nearest_mean", "own_cluster"] = "singletons",
        sampling: Literal["literal", "count"] = "literal",
        weights: Literal["all", "shared"] = "all",
        stages: Literal["both", "inference", "weights"] = "both",
        initial_shared: float | None = None,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        checks = [
            (eps_inference > 0, "eps_inference must be > 0"),
            (eps_weights > 0, "eps_weights must be > 0"),
            (min_points >= 1, "min_points must be >= 1"),
            (0 < psi <= 1, "psi must be in (0, 1]"),
            (0 < lr_decay <= 1, "lr_decay must be in (0, 1]"),
            (public_batch >= 1, "public_batch must be >= 1"),
            (hopkins_sample is None or hopkins_sample >= 1, "hopkins_sample must be >= 1 or None"),
            (rounding in ("floor", "round"), "rounding must be 'floor' or 'round'"),
            (
                noise in ("singletons", "nearest", "nearest_mean", "own_cluster"),
                "noise must be 'singletons', 'nearest', 'nearest_mean' or 'own_cluster'",
            ),
            (sampling in ("literal", "count"), "sampling must be 'literal' or 'count'"),
            (weights in ("all", "shared"), "weights must be 'all' or 'shared'"),
            (stages in ("both", "inference", "weights"), "stages must be 'both', 'inference' or 'weights'"),
            (initial_shared is None or initial_shared >= 0, "initial_shared must be >= 0 or None"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self.hopkins_threshold, self.eps_inference, self.eps_weights = hopkins_threshold, eps_inference, eps_weights
        self.min_points, self.psi, self.lr_decay = int(min_points), psi, lr_decay
        self.public_batch, self.hopkins_sample, self.rounding = public_batch, hopkins_sample, rounding
        self.noise, self.sampling, self.weights, self.stages = noise, sampling, weights, stages
        self.initial_shared = initial_shared
        self.shared_layers = 0.0
        self.events = 0
        self.last_event_round = 0
        self.public_weights = torch.empty(0, dtype=torch.float64)

    # -- set-up ------------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        public = server.data.public_x
        if public is None or len(public) == 0:
            raise ValueError(
                "FedTSDP clusters clients by their outputs on unlabelled server data: give the data "
                "module a public_size > 0 (data.init_args.public_size)"
            )
        total = len(server.model.layers())
        self.shared_layers = float(total if self.initial_shared is None else self.initial_shared)
        if self.shared_layers > total:
            raise ValueError(f"initial_shared={self.initial_shared} exceeds the model's {total} layers")
        self.public_weights = torch.full(
            (len(public),), 1.0 / len(public) if self.sampling == "literal" else 1.0, dtype=torch.float64
        )
        self.set_personal_mask(self.personal_mask_now())

    @property
    def effective_shared(self) -> float:
        """L^s on the half-layer grid: the number of (half) layers actually shared now."""
        return half_step(self.shared_layers, self.rounding)

    def personal_mask_now(self) -> Tensor:
        """Everything after the first `effective_shared` layers (half layers included) is personal."""
        return ~self.server.model.layer_count_mask(self.effective_shared, "first")

    # -- one round ---------------------------------------------------------------------------------
    def learning_rate_scale(self, round: int) -> float:
        """lr_decay^(round - 1): the factor on the configured learning rate in round `round`."""
        return self.lr_decay ** (round - 1)

    def pre_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """Public inference, Hopkins gate, and (when it opens) the two-stage clustering and the W update. Logs H,
        whether the clustering ran, the cluster counts after stages 1 and 2 (on events; the engine logs the current
        count as cluster/count), the learning-rate scale, JS and weight-distance statistics, and the batch's share
        of the sampling weights."""
        held = updates.all()
        self.log("fedtsdp/lr_scale", self.learning_rate_scale(round))
        m = len(held)
        if m < 2:
            return
        batch = self.draw_public_batch(round)
        public = self.server.data.public_x
        assert public is not None  # `setup` refuses a run without public data
        x = public[batch.to(public.device)]
        probs = torch.stack([self.server.model.predict(p, x).softmax(dim=-1) for p in held.params])  # (m, B, C)
        sample = default_sample_size(m) if self.hopkins_sample is None else min(self.hopkins_sample, m)
        seed = int(self.server.random.rng(round, "fedtsdp-hopkins").integers(2**62))
        H = hopkins(probs.reshape(m, -1), sample, generator=seed)
        js = js_divergence_matrix(probs)
        dist = l2_distance_matrix(held.params[:, self.stage2_mask()])
        off = ~torch.eye(m, dtype=torch.bool, device=js.device)
        statistics: dict[str, float | Tensor] = {
            "hopkins": H,
            "clustered": 0.0,
            "js_min": js[off].min(),
            "js_mean": js[off].mean(),
            "js_max": js[off].max(),
            "weight_distance_min": dist[off].min(),
            "weight_distance_median": dist[off].median(),
            "weight_distance_max": dist[off].max(),
        }
        for name, value in statistics.items():
            self.log(f"fedtsdp/{name}", value)
        if H > self.hopkins_threshold:
            labels, stage1 = self.two_stage_labels(js, dist)
            self.reassign(held.clients, labels)
            self.update_public_weights(batch)
            self.events += 1
            self.last_event_round = round
            self.log("fedtsdp/clustered", 1.0)
            self.log("fedtsdp/clusters_stage1", stage1.max() + 1)
            self.log("fedtsdp/clusters_stage2", labels.max() + 1)
        self.log("fedtsdp/public_batch_mass", self.public_weights[batch].sum() / self.public_weights.sum())

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        """After a clustering event: L^s <- psi L^s; tensors that stop being shared keep each client's own
        trained values (this round's upload)."""
        if self.last_event_round == round:
            before = self.effective_shared
            self.shared_layers *= self.psi
            if self.effective_shared != before:
                self.set_personal_mask(self.personal_mask_now(), updates.all())

    # -- the pieces ------------------------------------------------------------------------------
    def draw_public_batch(self, round: int) -> Tensor:
        """B distinct public indices drawn with probabilities W / sum(W), from a stream of (seed, round)."""
        n = len(self.public_weights)
        p = (self.public_weights / self.public_weights.sum()).numpy()
        rng = self.server.random.rng(round, "fedtsdp-public")
        return torch.as_tensor(np.sort(rng.choice(n, min(self.public_batch, n), replace=False, p=p)))

    def update_public_weights(self, batch: Tensor) -> None:
        """Eq. 7 (W[batch] += |D_pub| / B), then Eq. 8 (normalize) in literal mode."""
        W = self.public_weights
        W[batch] += len(W) / len(batch)
        if self.sampling == "literal":
            W /= W.sum()

    def stage2_mask(self) -> Tensor:
        """The entries stage 2 compares: trainable parameters (all, or only the shared ones)."""
        mask = self.server.model.parameter_mask()
        if self.weights == "shared" and self.personal_mask is not None:
            mask &= ~self.personal_mask
        return mask

    def two_stage_labels(self, js: Tensor, dist: Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(final labels, stage-1 labels) of the participants from their (m, m) JS divergence and weight
        distance matrices: DBSCAN(eps_inference) on `js`, then DBSCAN(eps_weights) on `dist` inside every
        stage-1 cluster, the sub-clusters numbered consecutively."""
        m = js.shape[0]
        if self.stages == "weights":
            stage1 = np.zeros(m, dtype=np.int64)
        else:
            stage1 = DBSCAN(self.eps_inference, self.min_points, noise=self.noise).fit_predict(js)
        if self.stages == "inference":
            return stage1, stage1
        distances = dist.detach().double().cpu().numpy()
        labels = np.empty(m, dtype=np.int64)
        start = 0
        for group in range(stage1.max() + 1):
            members = np.flatnonzero(stage1 == group)
            sub = DBSCAN(self.eps_weights, self.min_points, noise=self.noise).fit_predict(
                distances[np.ix_(members, members)]
            )
            labels[members] = start + sub
            start += sub.max() + 1
        return labels, stage1

    def reassign(self, clients: Tensor, labels: np.ndarray) -> None:
        """Put the participants into fresh clusters 0..k-1 of `labels` (absent clients keep theirs). A new
        cluster's model row starts as a copy of its first member's old cluster model; its shared part is
        overwritten by this round's average. Cluster rows nobody uses any more are dropped."""
        labels_t = torch.as_tensor(labels, device=self.assignment.device)
        first = [int(np.flatnonzero(labels == j)[0]) for j in range(int(labels.max()) + 1)]
        old_count = len(self.models)
        self.models = torch.cat([self.models, self.models[self.assignment[clients[first]]]])
        self.assignment[clients] = old_count + labels_t
        used, self.assignment = torch.unique(self.assignment, return_inverse=True)
        self.models = self.models[used]

    # -- reporting and checkpoints -----------------------------------------------------------------
    def cluster_labels(self) -> np.ndarray:
        return self.assignment.cpu().numpy()

    def round_metrics(self) -> dict[str, float]:
        """The clustering events so far, L^s and its effective value."""
        return {
            "fedtsdp/events": float(self.events),
            "fedtsdp/shared_layers": self.shared_layers,
            "fedtsdp/shared_layers_effective": self.effective_shared,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "shared_layers": self.shared_layers,
            "events": self.events,
            "last_event_round": self.last_event_round,
            "public_weights": self.public_weights,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.shared_layers, self.events = float(state["shared_layers"]), int(state["events"])
        self.last_event_round = int(state["last_event_round"])
        self.public_weights = state["public_weights"].detach().cpu().to(torch.float64)
