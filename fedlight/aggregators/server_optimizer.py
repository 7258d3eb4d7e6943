"""A server optimizer for any method (the `server_optimizer:` section): FedAvgM, FedAdam, FedYogi, FedAdagrad.

"Adaptive Federated Optimization" (Reddi et al., ICLR 2021), Algorithm 2: the round's aggregate minus the model the
clients started from is a pseudo-gradient, Delta, and the server steps its model with it,

    m = beta1 m + (1 - beta1) Delta
    v = beta2 v + (1 - beta2) Delta^2              (adam)
    v = v - (1 - beta2) Delta^2 sign(v - Delta^2)  (yogi)
    v = v + Delta^2                                (adagrad)
    x = x + lr m / (sqrt(v) + tau)

with v starting at tau^2 (the paper's v_{-1} >= tau^2) and no bias correction, as in the paper. `momentum` is
FedAvgM (Hsu et al., "Measuring the Effects of Non-Identical Data Distribution", 2019): m = beta m + Delta,
x = x + lr m; `sgd` is x = x + lr Delta (lr 1: FedAvg).

It acts inside the engine's cluster aggregator (`fedlight.aggregators.cluster_aggregator`), so it applies to every
model a method aggregates there, each with its own state: FedAvg's one model, each cluster of IFCA, OCFL, CFL, FeSEM,
FLIS, the shared part of FedPer, FedRep, LG-FedAvg, FedBN (a personal entry is never aggregated, so its Delta is 0
and it never moves), every component of FedEM, StoCFL's clusters and its global model. The state of a model is keyed
by the aggregator call of the round that produced it and its cluster row (a method asks for its aggregators in the
same order every round). Under `privacy:` it sees the noised aggregate: post-processing, epsilon unchanged. A method
that keeps no server model it aggregates (Local; pFedHN steps its hypernetwork with its own optimizer; SCAFFOLD sums
its updates itself) is refused after round 1 in one line, as a robust rule is.

Defaults (Reddi et al., Section 5 and Appendix D): beta1 0.9, beta2 0.99, tau 1e-3; the server learning rate has no
single best value in the paper (its grids span 10^-3 to 10^1 by task): 1.0 for sgd and momentum (FedAvg and FedAvgM's
usual setting), 0.01 for adam and yogi and 0.1 for adagrad, in the middle of the paper's best values for its image
tasks. Tune `lr` and `tau` on validation data (`fedlight tune`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlight.aggregators.cluster_aggregator import add_starts
from fedlight.plugin.aggregation import ClusterAverage
from fedlight.plugin.extension import RoundExtension
from fedlight.aggregators.config import ServerOptimizerConfig

if TYPE_CHECKING:
    from fedlight.aggregators.cluster_aggregator import ClusterAggregation
    from fedlight.plugin.round_updates import RoundUpdates


def server_step(config: ServerOptimizerConfig, delta: Tensor, state: dict[str, Tensor]) -> Tensor:
    """The step (to add to the model) of one model for its pseudo-gradient `delta`, updating its `state` (float64
    tensors `m` and `v`, created on the first step) in place."""
    delta = delta.to(torch.float64)
    kind, lr = config.kind, config.server_lr
    if kind == "sgd":
        return lr * delta
    if kind == "momentum":
        m = state["m"] = config.momentum * state["m"] + delta if "m" in state else delta.clone()
        return lr * m
    m = state["m"] = config.beta1 * state.get("m", torch.zeros_like(delta)) + (1 - config.beta1) * delta
    v = state.get("v", torch.full_like(delta, config.tau**2))
    square = delta * delta
    if kind == "adam":
        v = config.beta2 * v + (1 - config.beta2) * square
    elif kind == "yogi":
        v = v - (1 - config.beta2) * square * torch.sign(v - square)
    else:
        v = v + square
    state["v"] = v
    return lr * m / (v.sqrt() + config.tau)


class ServerOptimizer(RoundExtension):
    """The `server_optimizer:` section as a round extension: it puts itself into the run's cluster aggregation, keeps
    each aggregated model's state across rounds, and checkpoints it."""

    name = "server_optimizer"
    suspect = True  # a large server learning rate can make a round diverge

    def __init__(self, config: ServerOptimizerConfig) -> None:
        self.config = config
        self.states: dict[str, dict[str, Tensor]] = {}  # "<call>.<cluster>" -> {"m": ..., "v": ...}
        self.calls = 0
        self.shared_part_only = False  # whether a step left personal entries out (for the compatibility table)

    def aggregation(self, aggregation: "ClusterAggregation") -> "ClusterAggregation":
        aggregation.server_optimizer = self
        return aggregation

    def begin_round(self, round: int) -> None:
        self.calls = 0

    def next_call(self) -> int:
        """The number of the round's next aggregator call (the first is 1)."""
        self.calls += 1
        return self.calls

    def step(self, call: int, clusters: Tensor, base: Tensor, means: Tensor, personal_mask: Tensor | None) -> Tensor:
        """The models of `clusters` after the server step: each `base` row (the mean model its members started from,
        0 when the rows were updates already) moved by the step for its pseudo-gradient, the aggregate minus base."""
        stepped = torch.empty_like(means)
        for row, cluster in enumerate(clusters.tolist()):
            delta = means[row].to(torch.float64) - base[row].to(torch.float64)
            if personal_mask is not None:
                delta = delta.masked_fill(personal_mask, 0.0)
                self.shared_part_only = True
            state = self.states.setdefault(f"{call}.{cluster}", {})
            for name, tensor in state.items():  # a resumed run's state comes from the checkpoint on the CPU
                state[name] = tensor.to(delta.device)
            stepped[row] = (base[row].to(torch.float64) + server_step(self.config, delta, state)).to(means.dtype)
        return stepped

    def wrap(
        self,
        inner: Any,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None,
    ) -> "SteppedAggregate":
        """The run's aggregator `inner` of one call, its means stepped by this optimizer."""
        return SteppedAggregate(inner, self, self.next_call(), clusters, dim, dtype, device, personal_mask)

    def describe(self) -> str:
        return self.config.describe()

    def state_dict(self) -> dict[str, Any]:
        """Each aggregated model's optimizer state (`m`, `v`) on the CPU, keyed by "<call>.<cluster>"."""
        return {key: {name: tensor.cpu() for name, tensor in state.items()} for key, state in self.states.items()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.states = {key: dict(tensors) for key, tensors in (state or {}).items()}


class SteppedAggregate:
    """An aggregator whose means are the server optimizer's step from the members' mean start: `inner` combines the
    rows as the run configures (the mean, a robust rule, DP's noised sums) and the optimizer turns its result into the
    cluster's next model."""

    reads_starts = True  # the pseudo-gradient is the aggregate minus the model the members started from

    def __init__(
        self,
        inner: Any,
        optimizer: ServerOptimizer,
        call: int,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None,
    ) -> None:
        self.inner, self.optimizer, self.call, self.personal_mask = inner, optimizer, call, personal_mask
        self.base = ClusterAverage(clusters, dim, dtype, device)  # each cluster's mean start

    def add(self, clusters: Tensor, weights: Tensor, values: Any, starts: Tensor | None = None) -> None:
        """The inner aggregator's `add`, and each kept row's start counted in its cluster's mean start."""
        self.inner.add(clusters, weights, values, starts)
        keep = weights > 0  # as the aggregators leave out a client without samples
        add_starts(self.base, clusters[keep], None if starts is None else starts[keep])

    def reduce(self, updates: "RoundUpdates") -> None:
        """The inner aggregator's `reduce`, and the mean starts' sums added over the processes."""
        self.inner.reduce(updates)
        updates.sum_over_processes_(self.base.sums, self.base.totals)

    def means(self) -> tuple[Tensor, Tensor]:
        """(clusters with a member, their new models): the inner aggregator's means turned into the server optimizer's
        step from the members' mean start."""
        active, means = self.inner.means()
        base = self.base.sums[active] / self.base.totals[active, None].clamp(min=1)
        return active, self.optimizer.step(self.call, active, base, means, self.personal_mask)
