"""FedFomo: "Personalized Federated Learning with First Order Model Optimization" (Zhang, Sapra, Fidler, Yeung,
Alvarez, ICLR 2021), section 3: the first-order update of a client's model from other clients' models, and the
server's affinity matrix that picks, epsilon-greedily, which models each client receives.

Every client keeps its own model theta_i (the client state "local_models"; the initial model until it trains). A
client selected in round t:

    receives M models theta_n of other clients, picked by the server from row i of its affinity matrix P: for each
        of the M picks, with probability eps_t a model drawn at random, else the one with the highest P[i, n] not
        yet picked (ties in random order), eps_t = max(0, epsilon - epsilon_decay (t - 1));
    weighs each on its validation data D_i:  w_n = max(0, (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i||),
        normalized to sum 1 (all zero: the client keeps its own model);
    combines:  theta_i <- theta_i + sum_n w_n (theta_n - theta_i),
    trains theta_i locally (the module's SGD) and sends it back; the server keeps it as client i's model and adds
        to P[i, n] the signed weight (L_i(theta_i) - L_i(theta_n)) / ||theta_n - theta_i|| of each model received.

Clients are evaluated with their own models. Nothing is averaged: each client's trained model and its row of P are
what it returns (`Trained.state`), stored by the engine after the round, so the models a round's clients receive
are all from before the round, whatever order the groups train in.

Validation data D_i: the data module's val split when it has any row (a client without one keeps its own model);
otherwise a `val_share` of each client's training rows, drawn once per client from the (seed, client) stream and
left out of its local training (their sample weight is 0). The skew configs have no val split, so they take the
share.

Cost: a round's clients compute (M + 1) losses each, one pass of a model over the validation rows of the group's
clients that need it (`server.clients.losses` over those clients; the share's rows through `server.model.predict`), and
read M models each from the store; nothing grows with the clients not selected but P's rows, num_clients entries
for each client trained so far (the client state "affinity", 13.6 kB a client at 3,400 clients).

Defaults:
- M = 4: the authors' "5 models" setting (their README runs `--num_update_clients 4`: the client's own model and 4
  others; PFLlib's M = 5 counts the client's own row of P too, its top entry at the start).
- epsilon = 0.3, epsilon_decay = 0.05 a round: the authors' README commands (`--client_weight_epsilon 0.3
  --client_weight_epsilon_decay 0.05`).
- val_share = 0.2: the authors' `--train_split 0.8` and PFLlib's `val_ratio = 0.2`.

Deviations, and choices the paper leaves open:
- The models a client may receive are those of the clients that have trained at least once (a stored model), not
  only the previous round's uploads as in the authors' code: with 10 of 3,400 clients a round those would be 10.
  In round 1 no client has one, so every client trains its own model, as the authors' round 0 does.
- P starts at 0 and a client's own model is never among the M it receives (its weight would be 0); the authors'
  code starts P[i, i] at 0.1 and adds the client's own model to the M it downloads.
- P[i, n] grows by the signed first-order weight, unclipped and unnormalized, as PFLlib adds it (a model that hurt
  the client loses affinity); the authors' code divides the signed weights by the absolute value of their sum.
- ||.|| is the Euclidean norm of the flat models, as in PFLlib; the authors' code defaults to the l1 norm
  (`--model_delta_norm l1`). A weight whose loss is not finite, or whose model equals the client's, is 0.
- The baseline L_i(theta_i) is the client's current model, as the paper writes; the authors' commands compare with
  an earlier copy (`--baseline_model first_model`). Their hierarchical variant (sub-federations clustered from P)
  is not included.
- With a val share, local training minimizes the batch mean of sample weight x cross-entropy of the module's
  outputs (`server.clients.train_many`'s `sample_weights`) instead of the module's `training_step` (for `Classifier` the
  same loss), on batches of the configured size that count the held-out rows: an epoch takes the steps of every
  training row and sums the gradients of the others once, as an epoch over them alone would.
- Local training is the module's own optimizer (momentum, weight decay, schedulers), not the paper's plain SGD.
- A client that arrives after training (`newcomer_models`) gets the stored client model with the lowest loss on its
  own training data, as Local's newcomers do (the paper defines no placement; the base class's answer, the untrained
  initial model, scored 0.077 on the digits newcomers). `federation.finetune_epochs` trains it on its own data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, Newcomers, RoundUpdates, Trained, best_fitting

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

VALIDATION_PURPOSE = "fedfomo_validation"  # the stream that draws each client's held-out training rows
DOWNLOAD_PURPOSE = "fedfomo_download"  # the stream of the server's epsilon-greedy picks


def first_order_weights(own: Tensor, own_loss: Tensor, others: Tensor, losses: Tensor) -> tuple[Tensor, Tensor]:
    """(signed, normalized) weights of m received models `others` (m, d) for a client with model `own` (d,): signed
    w_n = (L(own) - L(theta_n)) / ||theta_n - own|| (0 where that is not finite or the models are equal), and
    max(0, w_n) normalized to sum 1 (all 0 when none is positive). `own_loss` and `losses` (m,) are the client's
    validation losses of its own model and of the received ones."""
    distance = (others - own).norm(dim=1)
    signed = (own_loss - losses) / distance
    signed = torch.where((distance > 0) & torch.isfinite(signed), signed, torch.zeros_like(signed))
    positive = signed.clamp(min=0)
    total = positive.sum()
    return signed, positive / total if total > 0 else positive


def first_order_update(own: Tensor, others: Tensor, weights: Tensor) -> Tensor:
    """theta_i + sum_n w_n (theta_n - theta_i): the client's model moved towards the received models `others` (m, d)
    by their weights (m,)."""
    return own + weights @ (others - own)


def epsilon_greedy(
    affinity: np.ndarray, candidates: np.ndarray, count: int, epsilon: float, rng: np.random.Generator
) -> list[int]:
    """`count` of `candidates` (all of them when fewer), picked one at a time: with probability `epsilon` the next
    of a random order of the candidates, else the next by `affinity` (highest first, ties in random order), skipping
    those already picked (the authors' e_greedy download)."""
    count = min(count, len(candidates))
    greedy = candidates[np.lexsort((rng.random(len(candidates)), -affinity[candidates]))].tolist()
    random_order = rng.permutation(candidates).tolist()
    picked: list[int] = []
    for _ in range(count):
        order = random_order if rng.random() < epsilon else greedy
        picked.append(next(int(c) for c in order if int(c) not in picked))
    return picked


class FedFomo(Algorithm):
    """Per-client models, each combined at the start of its round from M other clients' models by first-order
    weights on its validation data, then trained locally; the server picks the M by an affinity matrix P (rows in
    the client state "affinity") with epsilon-greedy exploration.

    Args:
        M: models of other clients each selected client receives (>= 1).
        epsilon: chance, at round 1, that a received model is drawn at random rather than by affinity, in [0, 1].
        epsilon_decay: how much epsilon falls each round (>= 0; it stops at 0).
        val_share: share of each client's training rows held out as its validation data when the data module gives
            no val split, in (0, 1); unused when it does.
        participation: share of clients selected each round.
    """

    def __init__(
        self,
        M: int = 4,
        epsilon: float = 0.3,
        epsilon_decay: float = 0.05,
        val_share: float = 0.2,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if isinstance(M, bool) or not isinstance(M, int) or M < 1:
            raise ValueError(f"M must be an integer >= 1 (the models each selected client receives), got {M!r}")
        if not 0 <= epsilon <= 1:
            raise ValueError(
                f"epsilon must be in [0, 1] (the chance a received model is drawn at random), got {epsilon}"
            )
        if not epsilon_decay >= 0:
            raise ValueError(f"epsilon_decay must be >= 0 (how much epsilon falls each round), got {epsilon_decay}")
        if not 0 < val_share < 1:
            raise ValueError(
                f"val_share must be in (0, 1) (the share of training rows held out for validation), got {val_share}"
            )
        self.M, self.epsilon, self.epsilon_decay, self.val_share = M, epsilon, epsilon_decay, val_share

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.local_models = server.state.declare("local_models", initial=server.model.initial_params)
        self.affinity = server.state.declare("affinity", initial=torch.zeros(server.num_clients, device=server.device))
        #: "val": the data module's val split; "train": a `val_share` of each client's training rows
        self.validation = "val" if int(server.clients.split("val").sizes().sum()) > 0 else "train"

    def client_model(self, client: int) -> Tensor:
        return self.local_models[client]

    def newcomer_models(self, newcomers: Newcomers) -> tuple[ClientModels, Tensor, None]:
        """Each newcomer gets the stored client model with the lowest loss on its training split."""
        models = ClientModels(self.client_model, self.server.num_clients)
        return models, best_fitting(newcomers, models), None

    # -- a client's round ---------------------------------------------------------------------------------------
    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Each client's model combined from the models it receives, then trained: (trained models, losses, {its
        model, its row of P with the signed weights added})."""
        received = self.download(round, clients)
        losses = self.validation_losses(clients, starts, received)
        affinity = self.affinity.read(clients)
        combined = starts.clone()
        for row, ids in enumerate(received):
            if ids:
                others = self.local_models.read(ids)
                signed, weights = first_order_weights(starts[row], losses[row][0], others, losses[row][1:])
                combined[row] = first_order_update(starts[row], others, weights)
                affinity[row, ids] += signed.to(affinity.dtype)
        trained = self.server.clients.train_many(
            round,
            clients,
            combined,
            lr_scale=self.learning_rate_scale(round),
            sample_weights=self.training_weights(clients),
        )
        trained.state = {"local_models": trained.params, "affinity": affinity}
        return trained

    def download(self, round: int, clients: list[int]) -> list[list[int]]:
        """The clients whose models each of `clients` receives: epsilon-greedy on its row of P among the clients
        with a stored model, drawn from the (seed, round, client) stream."""
        stored = self.local_models.touched().cpu().numpy()
        rows = self.affinity.read(clients).cpu().numpy()
        epsilon = max(0.0, self.epsilon - self.epsilon_decay * (round - 1))
        return [
            epsilon_greedy(
                row,
                stored[stored != client],
                self.M,
                epsilon,
                np.random.default_rng(self.server.random.client_seed(round, client, DOWNLOAD_PURPOSE)),
            )
            for client, row in zip(clients, rows)
        ]

    def validation_losses(self, clients: list[int], starts: Tensor, received: list[list[int]]) -> list[Tensor]:
        """For each client, (1 + its received models,) validation losses: its own model's first, then each received
        model's. One pass per distinct model, over the validation rows of the clients that need its loss."""
        position = {client: row for row, client in enumerate(clients)}
        needed: dict[int, list[int]] = {}  # model (a client's) -> rows of the clients that need its loss
        for row, (client, ids) in enumerate(zip(clients, received)):
            for model in (client, *ids):
                needed.setdefault(model, []).append(row)
        loss: dict[tuple[int, int], Tensor] = {}
        for model, rows in needed.items():
            params = starts[position[model]] if model in position else self.local_models[model]
            for row, value in zip(rows, self.losses(params, [clients[r] for r in rows])):
                loss[row, model] = value
        return [
            torch.stack([loss[row, model] for model in (client, *ids)])
            for row, (client, ids) in enumerate(zip(clients, received))
        ]

    # -- validation data ----------------------------------------------------------------------------------------
    def losses(self, params: Tensor, clients: list[int]) -> Tensor:
        """(len(clients),) mean cross-entropy of one flat model on each client's validation data (NaN for a client
        without any)."""
        if self.validation == "val":
            return self.server.clients.losses(params[None], "val", clients)[0]
        split = self.server.clients.split("train")
        parts = [(x[held], y[held]) for x, y, held in ((*split.client(c), self.held_out_rows(c)) for c in clients)]
        y = torch.cat([part[1] for part in parts])
        sizes = torch.tensor([len(part[1]) for part in parts], device=y.device)
        owner = torch.repeat_interleave(torch.arange(len(clients), device=y.device), sizes)
        entropy = F.cross_entropy(
            self.server.model.predict(params, torch.cat([part[0] for part in parts])), y, reduction="none"
        )
        return torch.bincount(owner, weights=entropy, minlength=len(clients)) / sizes

    def held_out_rows(self, client: int) -> Tensor:
        """The client's training rows kept for validation when there is no val split: a `val_share` of them (at
        least one row left to train), the same in every round, drawn from the (seed, client) stream."""
        n = int(self.server.clients.train_sizes[client])
        count = max(0, min(int(round(self.val_share * n)), n - 1))
        generator = torch.Generator().manual_seed(self.server.random.client_seed(0, client, VALIDATION_PURPOSE))
        return torch.randperm(n, generator=generator)[:count].to(self.server.device)

    def training_weights(self, clients: list[int]) -> list[Tensor] | None:
        """Per client a weight per training row, 0 on the rows held out for validation (None with a val split)."""
        if self.validation == "val":
            return None
        weights = []
        for client in clients:
            weight = torch.ones(int(self.server.clients.train_sizes[client]), device=self.server.device)
            weight[self.held_out_rows(client)] = 0
            weights.append(weight)
        return weights

    # -- the server ---------------------------------------------------------------------------------------------
    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Nothing to combine: the engine stores each client's model and row of P from what it returned."""

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        """Every client is evaluated with its own model."""
        n = self.server.num_clients
        return ClientModels(self.local_models.__getitem__, n), torch.arange(n, device=self.server.device)
