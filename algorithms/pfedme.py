"""pFedMe: "Personalized Federated Learning with Moreau Envelopes" (Dinh, Tran and Nguyen, NeurIPS 2020),
Algorithm 1 (section 3.2).

Every client keeps a personalized model theta_i, the (approximate) minimizer of its Moreau-envelope problem
theta_i(w) = argmin_theta f_i(theta) + lambda/2 ||theta - w||^2 around its local copy w of the global model. A round:

    client (from the global model w):  w_local = theta = w
        for each of the round's R local iterations, a batch each:
            theta   <- K gradient steps of size personal_lr on f(theta; batch) + lambda/2 ||theta - w_local||^2,
                       starting from the current theta                                           (`personalize`)
            w_local <- w_local - eta * lambda * (w_local - theta)
        sends w_local, and theta beside it (`Updates.state`)
    server:  w <- (1 - beta) w + beta * mean(w_local over the round's sampled clients S)
    evaluation: each client's own theta_i, from its last round of training

Which clients train (`train_every_client`). Algorithm 1 and the authors' code (their server's `train`: "do update
for all users not only selected users", then `select_users`) train EVERY client each round and sample only the S
clients whose w_local the server averages. That is the default, `train_every_client: true`: every client trains
(`select_clients` returns all of them, trained in the engine's groups, vectorized where the plan allows), the S
sampled ones (`participation`'s share, drawn from the round's selection stream exactly as the cohort-only variant
draws them) are averaged, and every client's theta is stored (the engine's client state "personal"), the unsampled
clients' included: their personal models move every round, as in the paper, while their w_local is discarded.
`train_every_client: false` trains only the sampled clients (the engine's cohort, as every other method), so an
unsampled client keeps its last theta; with participation 1 the two are the same run. Training every client is
all-client work: with `federation.clients_per_round` below the clients (cross-device) the default is refused at
set-up in one line naming `train_every_client` (`ServerContext.cohort.needs_every_client`), so a cross-device run states
`train_every_client: false` (configs/cross_device/femnist/pfedme.yaml); so is a `privacy:` section with a share
below 1, whose accountant and adaptive clipping would count every trained client as released.

Defaults are the paper's MNIST setting (section 5, the authors' published commands): K = 5, lambda = 15,
personal_lr = 0.09 (the non-convex DNN; 0.1 for its convex logistic regression) and beta = 1. beta = 1 is the
setting of every experiment the authors published commands for; the paper also studies larger values (beta = 2),
reporting a faster global model. We keep 1 because it makes the server step exactly the engine's FedAvg, so pFedMe
differs from FedAvg only in the clients' work; beta = 2 is one option away. The paper's eta = 0.005, |D| = 20 and
R = 20 are the run's settings here (the module's learning rate, `federation.batch_size`, `federation.local_epochs`).

Deviations from the paper, and why:
- eta is the module's configured learning rate of the round (`server.clients.learning_rate(round)`), so schedulers
  apply; the module's optimizer itself is not used: momentum and weight decay do not enter these plain gradient steps.
- R is the client's optimizer steps of a round (its batches times `federation.local_epochs`, each sample once per
  epoch, the batches `server.clients.batches` gives), not a fixed count of sampled batches: the same local work as
  FedAvg's.
- mean(w_local) is the training-set-size weighted mean, as the authors' code and the engine's FedAvg average; the
  paper writes the plain mean over the selected clients (the same when clients are equally large).
- theta starts from the received global model at each round and carries over between the round's iterations, as in
  the authors' code (the paper leaves the inner solver's start open).
- Buffers (BatchNorm running statistics) are not trained by these gradient steps: they keep the values received.
- With `train_every_client: false`, a client not sampled in a round keeps its last theta for evaluation (the
  initial model before its first round).

Slow start, then ahead: on the digits label-skew config (2 classes a client) pFedMe's personalized models trail
FedAvg's global one early (mean test accuracy 0.568 at round 10, 0.718 at round 20, where FedAvg with its momentum 0.5
has 0.826) and pass it later (0.898 at round 40, 0.974 at round 60, against FedAvg's 0.898 at the same plain SGD at
round 60; seed 0, `python -m fedlight fit --config configs/digits/skew/pfedme.yaml --federation.rounds 60`). With
lambda = 15 a client's theta stays within about 1/lambda of its w_local, so its personal model follows the global one
until w has learned enough for the personal step to specialize it; its plain gradient steps (no momentum) make that
early phase slower than FedAvg's. Compare it over the config's own 60 rounds, not at 20.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, RoundUpdates, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

#: (loss, flat gradient) of the local loss at a flat model
LossAndGrad = Callable[[Tensor], tuple[Tensor, Tensor]]


def personalize(
    loss_and_grad: LossAndGrad, theta: Tensor, anchor: Tensor, lam: float, lr: float, steps: int
) -> tuple[Tensor, Tensor]:
    """pFedMe's inner solver: `steps` gradient steps of size `lr` on f(theta) + lam/2 ||theta - anchor||^2 from
    `theta`, where `loss_and_grad(theta)` is (f(theta), grad f(theta)). Returns (the last iterate, f at the point of
    the last step)."""
    loss = theta.new_full((), float("nan"))
    for _ in range(steps):
        loss, grad = loss_and_grad(theta)
        theta = theta - lr * (grad + lam * (theta - anchor))
    return theta, loss


class PFedMe(Algorithm):
    """pFedMe: clients move their copy of the global model towards personalized models, each the approximate
    solution of a Moreau-envelope problem; the server mixes the clients' copies into the global model with `beta`.
    Every client is evaluated with its own personalized model.

    Args:
        lam: lambda, the weight of the proximal term tying a personalized model to the client's copy (>= 0).
        K: gradient steps of the inner solver per local iteration (>= 1).
        personal_lr: step size of the inner solver (> 0).
        beta: the server's mixing weight, w <- (1 - beta) w + beta * mean(w_local) (> 0; 1 is plain averaging).
        train_every_client: True (the paper's Algorithm 1 and its code): every client trains every round and its
            theta is updated; the `participation` share samples the clients whose w_local is averaged. Refused with
            `federation.clients_per_round` below the clients. False: only the sampled clients train (the engine's
            cohort), the others keep their theta.
        participation: share of clients sampled each round: averaged (train_every_client) or trained and averaged.
    """

    def __init__(
        self,
        lam: float = 15.0,
        K: int = 5,
        personal_lr: float = 0.09,
        beta: float = 1.0,
        train_every_client: bool = True,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        if int(K) != K or K < 1:
            raise ValueError(f"K must be an integer >= 1, got {K}")
        if personal_lr <= 0:
            raise ValueError(f"personal_lr must be > 0, got {personal_lr}")
        if beta <= 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        self.lam, self.K, self.personal_lr, self.beta = lam, int(K), personal_lr, beta
        self.train_every_client = bool(train_every_client)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.personal_models = server.state.declare(
            "personal", initial=server.model.initial_params
        )  # every client's theta
        if not self.train_every_client:
            return
        option = "algorithm.init_args.train_every_client: false"
        server.cohort.needs_every_client(
            "pFedMe",
            "every round (train_every_client, Algorithm 1: the sampled clients are those averaged)",
            instead=option,
        )
        if server.aggregation.private and len(self.sampled_clients(1)) < server.num_clients:
            raise ValueError(
                f"pFedMe with train_every_client trains every client but averages a participation share "
                f"({self.participation}), which DP's accountant and adaptive clipping cannot tell "
                f"apart: set {option} or participation 1.0 with a privacy section"
            )

    def select_clients(self, round: int) -> list[int]:
        """Every client (`train_every_client`), else the sampled clients (`sampled_clients`)."""
        if self.train_every_client:
            return list(range(self.server.num_clients))
        return self.sampled_clients(round)

    def sampled_clients(self, round: int) -> list[int]:
        """The round's S: the clients whose w_local the server averages, the base class's draw from the round's
        selection stream (every client with participation 1)."""
        return super().select_clients(round)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Algorithm 1's client for a group at once (`server.clients.group_batches`,
        `server.model.group_loss_and_grad`): (w_local's, mean loss f(theta; batch) of each client's last epoch,
        {"personal": theta's})."""
        server = self.server
        eta = server.clients.learning_rate(round)
        local, theta = starts.clone(), starts.clone()
        losses: list[list[Tensor]] = [[] for _ in clients]
        for group in server.clients.group_batches(round, clients):
            rows = group.rows
            if group.step == 0:
                for row in rows:
                    losses[row] = []  # the mean loss of the last epoch, as the module's SGD reports
            solved, loss = personalize(
                partial(server.model.group_loss_and_grad, batch=group.batch, step=group.step),
                theta[rows],
                local[rows],
                self.lam,
                self.personal_lr,
                self.K,
            )
            theta[rows] = solved
            local[rows] = local[rows] - eta * self.lam * (local[rows] - solved)
            for i, row in enumerate(rows):
                losses[row].append(loss[i])
        loss = torch.stack([torch.stack(kept).mean() if kept else starts.new_full((), float("nan")) for kept in losses])
        return Trained(local, loss, {}, {"personal": theta})

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """w <- (1 - beta) w + beta * (training-set-size weighted mean of the sampled clients' w_local); each trained
        client's theta is kept for its evaluation (the engine stores what clients return as "personal")."""
        before = self.models[0].clone()
        if self.train_every_client:
            self.average_sampled(round, updates)
        else:
            super().aggregate(round, updates)  # models[0] becomes the mean (kept when nobody trained)
        if self.beta != 1:
            mean = self.models[0].double()
            self.models[0] = ((1 - self.beta) * before.double() + self.beta * mean).to(self.models.dtype)

    def average_sampled(self, round: int, updates: RoundUpdates) -> None:
        """models[0] <- the run's aggregate (the weighted mean, a robust rule) of the sampled clients' w_local,
        streamed a group at a time; the other clients' rows are passed over (kept when no sampled client trained)."""
        models = self.models
        sampled = torch.zeros(self.server.num_clients, dtype=torch.bool, device=models.device)
        sampled[self.sampled_clients(round)] = True
        average = self.server.aggregation.new(1, models.shape[1], models.dtype, models.device)
        for group in updates.groups():
            kept = group.subset(sampled[group.clients])
            del group  # or it would stay alive while the next group trains: two groups in memory
            average.add(self.assignment[kept.clients], kept.num_samples.to(models.dtype), kept.params, kept.starts)
            del kept
        average.reduce(updates)
        self.set_shared(*average.means())

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        """Every client's own personalized model theta_i."""
        n = self.server.num_clients
        return ClientModels(self.personal_models.__getitem__, n), torch.arange(n, device=self.server.device)
