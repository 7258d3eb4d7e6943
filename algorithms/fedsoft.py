"""FedSoft ("FedSoft: Soft Clustered Federated Learning with Proximal Local Updating", Ruan and Joe-Wong, AAAI 2022,
section 4, Algorithm 1): S cluster centers and soft memberships. A client's data is a mix of the clusters'
distributions; its importance weight u_ks is the share of its samples that center s fits best (lowest loss). Each
client keeps one local model w_k across rounds and trains it on its loss plus the proximal term
(lambda / 2) sum_s u_ks ||w_k - c_s||^2, so it learns from every center in proportion to how much of its data is like
that center's. The server updates each center from the clients' local models, weighted by the clients' importance to
it.

As the authors' code (ycruan/FedSoft, clients.py and servers.py) runs it:
- every `estimation_interval` rounds (tau), every client estimates u_k on its training split: the fraction of its
  samples whose cross-entropy is lowest under center s, a zero count replaced by `count_smoother` (sigma) times its
  sample count;
- the server's importance of client k to center s is v_sk = u_ks n_k / sum_j u_js n_j (over all clients);
- with selection (`selection_size` = K, the default), each center draws K clients without replacement with
  probabilities v_s; the union of the draws trains, and center s becomes the plain mean of its K draws' local models;
  without selection every client trains every round and c_s = sum_k v_sk w_k;
- the centers start from independent random initializations (center 0 from the run's initial model), the local models
  all from the run's initial model; the proximal term acts on the parameters (not BatchNorm's statistics).
Defaults: lambda 0.01, sigma 1e-4, tau 2, K 15, the authors' CIFAR-10 setting (main.py, solvers.py). The local solver
is the run's optimizer (the authors use Adam at 5e-4, 10 local epochs: set them in the config).

A client is evaluated with its local model (the paper's personalized model); `evaluate: center` evaluates each with
its most important center instead (the paper's cluster models). The logged cluster of a client is argmax_s u_ks.

Why FedSoft finds the clusters but trails IFCA where clients hold little data (measured on configs/digits/fedsoft.yaml,
4 rotation clusters of 5 clients, ~60 training images a client, seed 0, 30 rounds): the local models persist and the
proximal pull is the only thing that brings other clients' data into them. At the authors' lambda 0.01 it is too weak
to matter, so a local model is Local's (0.82 against Local's 0.80), and a center, the mean of local models that drifted
apart from one start, is no better (0.81). At lambda 0.1 the pull keeps each local model near its center and the
centers reach 0.93 (IFCA 0.96); at 1.0 it ties the models together before the clusters separate (ARI 0.28). The
default stays the authors'; set `reg_weight` for the data a client has, and evaluate the centers where clusters are
what matter.

Deviations:
- the estimation is work on every client (`tau` rounds apart), as the paper's; the cohort is the method's own draw,
  so `federation.clients_per_round` is refused;
- the centers are means of local models that persist across rounds, not of updates from a common start, so the
  engine's robust rules and DP (which clip and combine updates) do not apply: such a run is refused after round 1,
  when no aggregator combined them (`ClusterAggregation.check_applied`);
- a client that arrives after training has no local model: it estimates its importance weights on its training split
  and is evaluated with its most important center.

Asynchronous rounds (`system.buffer_size`): a local model arrives exactly as trained (only its client writes it, so
nothing moved under it: `fedlight.system.buffered`), and with
selection it counts for the centers whose draws it was in when it was sent out (each client sends that beside its
model, `DRAWN_BY`), so a center averages the arrived local models it drew; in a synchronous round those are the
round's draws.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin import ROUTING, Algorithm, ClientModels, Newcomers, Plan, RoundUpdates, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

#: what a client sends beside its model under selection: which centers drew it in the round it trained
DRAWN_BY = "drawn_by"


def importance_fractions(losses: Tensor, owner: Tensor, sizes: Tensor, smoother: float) -> Tensor:
    """(clients, S) u_ks: the share of client k's samples whose loss is lowest under center s (losses: (S, rows),
    owner: (rows,) the client of each row, sizes: (clients,) its sample count), a zero share replaced by `smoother`."""
    clusters = losses.shape[0]
    counts = torch.zeros(len(sizes), clusters, dtype=torch.float64, device=losses.device)
    counts.index_put_((owner, losses.argmin(dim=0)), torch.ones_like(owner, dtype=torch.float64), accumulate=True)
    shares = counts / sizes.to(torch.float64)[:, None]
    return torch.where(counts == 0, torch.full_like(shares, smoother), shares)


def center_importance(fractions: Tensor, sizes: Tensor) -> Tensor:
    """(S, clients) v_sk = u_ks n_k / sum_j u_js n_j: each center's distribution over the clients."""
    mass = fractions * sizes.to(fractions.dtype)[:, None]
    return (mass / mass.sum(dim=0, keepdim=True)).T


def proximal_gradient(params: Tensor, fractions: Tensor, centers: Tensor, lam: float) -> Tensor:
    """The gradient of (lambda / 2) sum_s u_ks ||w_k - c_s||^2 at the rows w_k: lambda (sum_s u_ks w_k - u_k C)."""
    return lam * (fractions.sum(dim=1, keepdim=True) * params - fractions @ centers)


class FedSoft(Algorithm):
    """S centers, per-client importance weights, local models trained with a proximal pull towards the centers.

    Args:
        num_clusters: S, the number of centers.
        reg_weight: lambda, the proximal term's weight (>= 0).
        count_smoother: sigma, the importance of a center that fits none of a client's samples (in (0, 1)).
        estimation_interval: tau, rounds between importance estimations (>= 1).
        selection_size: K clients drawn for each center every round; None trains every client every round.
        evaluate: "local" (each client's local model) or "center" (its most important center).
    """

    plan = Plan(holds_updates=True)  # every center reads every trained local model

    def __init__(
        self,
        num_clusters: int = 2,
        reg_weight: float = 0.01,
        count_smoother: float = 1e-4,
        estimation_interval: int = 2,
        selection_size: int | None = 15,
        evaluate: Literal["local", "center"] = "local",
    ) -> None:
        super().__init__()
        checks = [
            (num_clusters >= 1, "num_clusters", num_clusters, ">= 1"),
            (reg_weight >= 0, "reg_weight", reg_weight, ">= 0"),
            (0 < count_smoother < 1, "count_smoother", count_smoother, "in (0, 1)"),
            (estimation_interval >= 1, "estimation_interval", estimation_interval, ">= 1"),
            (selection_size is None or selection_size >= 1, "selection_size", selection_size, ">= 1 or null"),
            (evaluate in ("local", "center"), "evaluate", evaluate, "'local' or 'center'"),
        ]
        for ok, name, value, wanted in checks:
            if not ok:
                raise ValueError(f"algorithm.init_args.{name} must be {wanted}, got {value!r}")
        self.num_clusters, self.reg_weight, self.count_smoother = num_clusters, reg_weight, count_smoother
        self.estimation_interval, self.selection_size, self.evaluate = estimation_interval, selection_size, evaluate

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.message.sends(DRAWN_BY, ROUTING)  # the centers whose draws sent the client out
        n, s = server.num_clients, self.num_clusters
        if server.cohort.clients_per_round is not None:
            raise ValueError(
                "FedSoft draws its own clients (selection_size for each center, by importance): leave "
                "federation.clients_per_round out"
            )
        if s > n:
            raise ValueError(f"algorithm.init_args.num_clusters is {s}, more than the {n} clients: give at most {n}")
        if self.selection_size is not None and self.selection_size > n:
            raise ValueError(
                f"algorithm.init_args.selection_size is {self.selection_size}, more than the {n} clients: "
                f"give at most {n}, or null to train every client"
            )
        empty = np.flatnonzero(server.clients.train_sizes.cpu().numpy() == 0)
        if len(empty):
            raise ValueError(
                f"FedSoft estimates each client's importance weights from its training samples, but "
                f"client {int(empty[0])} has none: give every client training data (data.init_args)"
            )
        server.cohort.declare_every_client_work(
            f"every client estimates its importance weights every "
            f"{self.estimation_interval} rounds (a pass of each center over its data)"
        )
        seeds = server.random.rng(0, "fedsoft-centers").integers(2**31, size=s)
        self.models = torch.stack(
            [server.model.initial_params] + [server.model.random_params(int(x)) for x in seeds[1:]]
        )
        self.local_models = server.state.declare("local_models", initial=server.model.initial_params)
        self.fractions = torch.full((n, s), 1.0 / s, dtype=torch.float64, device=server.device)

    def begin_round(self, round: int) -> None:
        """Every tau rounds (from round 1), every client's importance weights from the centers' losses on its data."""
        if (round - 1) % self.estimation_interval == 0:
            losses, owner = self.server.clients.sample_losses(self.models)
            self.fractions = importance_fractions(losses, owner, self.server.clients.train_sizes, self.count_smoother)
            self.assignment = self.fractions.argmax(dim=1).to(self.assignment)

    def draws(self, round: int) -> list[list[int]]:
        """Each center's K draws of round `round` by its importance v_s, without replacement, from the (seed, round)
        stream (every client, for every center, without selection)."""
        n = self.server.num_clients
        if self.selection_size is None:
            return [list(range(n))] * self.num_clusters
        v = center_importance(self.fractions, self.server.clients.train_sizes).cpu().numpy()
        rng = self.server.random.rng(round, "fedsoft-selection")
        return [sorted(rng.choice(n, size=self.selection_size, replace=False, p=p / p.sum()).tolist()) for p in v]

    def select_clients(self, round: int) -> list[int]:
        """The union of the centers' draws."""
        return sorted(set().union(*self.draws(round)))

    def client_model(self, client: int) -> Tensor:
        return self.local_models[client]

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The module's SGD on each local model with the proximal pull towards the centers by its importance; with
        selection, each client also sends which centers drew it (`DRAWN_BY`: (clients, S), 1 where drawn)."""
        fractions = self.fractions[clients].to(starts.dtype)
        centers, lam = self.models.to(starts.dtype), self.reg_weight

        def pull(rows: list[int], params: Tensor, grad: Tensor, _: Tensor) -> None:
            grad += proximal_gradient(params, fractions[rows], centers, lam)  # on buffers too: no optimizer reads it

        trained = self.server.clients.train_many(
            round, clients, starts, lr_scale=self.learning_rate_scale(round), gradient_hook=pull if lam > 0 else None
        )
        if self.selection_size is not None:
            draws = self.draws(round)
            trained.state = {
                **trained.state,
                DRAWN_BY: starts.new_tensor([[c in drawn for drawn in draws] for c in clients]),
            }
        return trained

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The trained local models are stored; center s becomes the mean of its draws' local models (without
        selection: the v_s-weighted sum of every client's)."""
        held = updates.all()
        self.local_models.write(held.clients, held.params)
        if self.selection_size is None:
            v = center_importance(self.fractions, self.server.clients.train_sizes).to(held.params.dtype)
            weights = v[:, held.clients]
            self.models = (weights / weights.sum(dim=1, keepdim=True)) @ held.params
            return
        drawn_by = held.state[DRAWN_BY] > 0  # the draws each client was sent out in (this round's, synchronously)
        for s in range(self.num_clusters):
            rows = drawn_by[:, s].nonzero().flatten()  # a client left out (non-finite) sends nothing
            if len(rows):
                self.models[s] = held.params[rows].mean(dim=0)

    def evaluation_models(self) -> tuple[Tensor | ClientModels, Tensor]:
        n = self.server.num_clients
        if self.evaluate == "center":
            return self.models, self.fractions.argmax(dim=1).to(self.server.device)
        return ClientModels(self.client_model, n), torch.arange(n, device=self.server.device)

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, Tensor]:
        """Each newcomer's importance weights on its training split; it is evaluated with its most important center."""
        losses, owner = newcomers.sample_losses(self.models)
        sizes = torch.bincount(owner, minlength=newcomers.count)
        clusters = importance_fractions(losses, owner, sizes.clamp(min=1), self.count_smoother).argmax(dim=1)
        clusters = clusters.to(self.models.device)
        return self.models, clusters, clusters

    def cluster_labels(self) -> np.ndarray:
        return self.fractions.argmax(dim=1).cpu().numpy()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "fractions": self.fractions.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.fractions = state["fractions"].to(self.server.device)
        self.assignment = self.fractions.argmax(dim=1).to(self.assignment)
