"""FedAMP: "Personalized Cross-Silo Federated Learning on Non-IID Data" (Huang, Chu, Zhou, Wang, Liu, Pei, Zhang;
AAAI 2021), section 4, federated attentive message passing.

Every client i keeps a personal model w_i (the client state "personal", the initial model w^0 until it trains). The
paper minimizes sum_i F_i(w_i) + lambda sum_{i<j} A(||w_i - w_j||^2) with A(x) = 1 - exp(-x / sigma) by alternating
two steps each round k:

    server (message passing): for each client i, a personalized cloud model
        u_i = sum_j xi_ij w_j,  xi_ij = alpha_k A'(||w_i - w_j||^2) = alpha_k exp(-||w_i - w_j||^2 / sigma) / sigma
        for j != i, and xi_ii = 1 - sum_{j != i} xi_ij                       (`attention_weights`, `cloud_models`)
    client i (a proximal step): w_i <- argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2, approximated by the
        module's SGD from u_i with (lambda / alpha_k)(w - u_i) added to every gradient; the result is its new w_i

Similar clients (small ||w_i - w_j||^2, large A') weigh each other more: the attention is A', not a learned one.
Clients are evaluated with their personal models w_i.

Defaults: alpha_k = 1 and lambda = 1 are PFLlib's (its command-line defaults alphaK and lamda); section 4 fixes no
values, and the paper's experimental settings are not reproduced here. PFLlib's sigma = 1 is not kept: with
alpha_k = 1, xi_ii = 1 - sum_{j != i} A'(.) then falls far below 0 as soon as more than two clients take part and
the models are still close (configs/digits/skew, 20 clients: xi_ii about -7 in round 2, every client's test accuracy
0, as u_i steps far past the others). sigma defaults to alpha_k (m - 1) for m clients a round, the smallest value
that keeps every xi_ii >= 0 whatever the distances (A' <= 1 / sigma), so that every u_i is a convex combination of
the round's models. The price: while the models are still close (d_ij << sigma) every xi_ij is about 1 / (m - 1), so
xi_ii is about 0 and a client's cloud model u_i is the mean of the others', its own model weighing nothing until the
models move apart; the logged self weights show when that ends. sigma is also the scale of the squared distances
that tell clients apart: the run logs the round's mean (`fedamp/sq_distance_mean`) and its self weights
(`fedamp/self_weight_mean`, `fedamp/self_weight_min`), to tune it by.

Which clients the sum runs over: the paper is cross-silo and every client takes part in every round, so u_i mixes
every client's w_j. Here it mixes the round's clients only (their stored w_j, the initial model for a client that
never trained), so the server's work grows with the clients a round, not with all clients: with every client
selected (`participation` 1, the default) it is the paper's step; with 10 of 3,400 a round, each u_i mixes 10 models.

Deviations, and why:
- The client's proximal step starts from u_i, the centre of the proximal term and the model the server sends; the
  paper's step is an argmin and does not say where its solver starts. PFLlib continues from the client's own w_i.
- PFLlib's client adds lambda / (2 alpha_k) ||w - u_i|| unsquared to its loss, built from the parameters' `.data`
  (clientamp.py), so the term carries no gradient and u_i never reaches the client's training: PFLlib's FedAMP clients
  train locally from their own w_i, as Local does, and its leaderboard number is not a reference for this
  implementation. Here the paper's squared norm, whose gradient (lambda / alpha_k)(w - u_i) is applied.
- alpha_k is one constant for every round, as in PFLlib (the paper allows a sequence of step sizes).
- xi_ij = alpha_k A'(.) as section 4 writes the weights; the exact gradient of sum_{i<j} A(||w_i - w_j||^2) would
  carry a factor 2, folded into alpha_k. A sigma given below alpha_k (m - 1) allows xi_ii < 0: u_i then steps past
  the others, as the gradient step does with a large step size.
- Not the paper's heuristic for deep networks (HeurFedAMP: weights from cosine similarities through a softmax of
  exp(sigma cos), with xi_ii a chosen self-attention weight); this is section 4's A'(||w_i - w_j||^2).
- The local solver is the module's own optimizer (momentum, weight decay, schedulers as configured).
- The server keeps what each client sent as its w_i (an update attack's model, under an attack); a client that has
  not taken part holds w^0. A held-out newcomer gets the stored personal model w_i with the lowest loss on its own
  training data, as Local's newcomers do (the paper defines no placement; w^0, the base class's global row, which
  FedAMP never changes, is the untrained network).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.cluster.similarity import l2_distance_matrix
from fedlight.plugin import Algorithm, ClientModels, Newcomers, Plan, RoundUpdates, Trained, best_fitting

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def squared_distances(models: Tensor) -> Tensor:
    """(m, m) float64 ||w_i - w_j||^2 of the rows of `models` (column blocks at a time, `l2_distance_matrix`)."""
    return l2_distance_matrix(models.float()).double() ** 2


def attention_weights(sq_distances: Tensor, alpha_k: float, sigma: float) -> Tensor:
    """The (m, m) message-passing weights of section 4 from the squared distances of m models: xi_ij = alpha_k
    exp(-d_ij / sigma) / sigma (alpha_k A'(d_ij), A(x) = 1 - exp(-x / sigma)) off the diagonal, and
    xi_ii = 1 - sum_{j != i} xi_ij, so every row sums to 1."""
    xi = alpha_k * torch.exp(-sq_distances / sigma) / sigma
    xi.fill_diagonal_(0.0)
    return xi + torch.diag(1.0 - xi.sum(dim=1))


def cloud_models(models: Tensor, xi: Tensor) -> Tensor:
    """The personalized cloud models u_i = sum_j xi_ij w_j of the rows w_1..w_m of `models`, as rows. Computed as
    W + (xi - I)(W - mean of the rows) (the rows of xi - I sum to 0), so the products' rounding is relative to the
    models' spread, and equal models give themselves exactly."""
    work = models.float()
    moves = (xi - torch.eye(len(xi), dtype=xi.dtype, device=xi.device)).to(device=work.device, dtype=work.dtype)
    return (work + moves @ (work - work.mean(dim=0))).to(models.dtype)


class FedAMP(Algorithm):
    """Federated attentive message passing: the server mixes the round's personal models into a cloud model for
    each client, weighted by how close their models are; each client takes a proximal step from its cloud model on
    its own data, and keeps the result as its personal model.

    Args:
        alpha_k: the server's step size on the attention term (> 0): the weight xi_ij = alpha_k A'(.) of each
            other client, and the proximal weight lambda / alpha_k.
        lam: lambda >= 0, the weight of the attention term (0: clients train alone from their cloud models).
        sigma: the scale of A(x) = 1 - exp(-x / sigma) (> 0), in units of squared parameter distance; None:
            alpha_k (m - 1) for m clients a round, the smallest that keeps every cloud model a convex combination.
        participation: share of clients selected each round (the paper: every client, 1).
    """

    plan = Plan(holds_updates=True)  # the round's trained models become the clients' personal models at once

    def __init__(
        self, alpha_k: float = 1.0, lam: float = 1.0, sigma: float | None = None, participation: float = 1.0
    ) -> None:
        super().__init__(participation)
        if not alpha_k > 0:
            raise ValueError(
                f"alpha_k must be > 0 (the server's step size), got {alpha_k}: give a positive value such as 1.0"
            )
        if not lam >= 0:
            raise ValueError(f"lam must be >= 0 (the attention term's weight), got {lam}: give 0 or more, such as 1.0")
        if sigma is not None and not sigma > 0:
            raise ValueError(
                f"sigma must be > 0 (the scale of A(x) = 1 - exp(-x / sigma)), got {sigma}: give a "
                "positive value, or None for alpha_k x (clients a round - 1)"
            )
        self.alpha_k, self.lam, self.sigma = alpha_k, lam, sigma
        self.cloud: dict[int, Tensor] = {}  # the round's cloud model of each of its clients, until it aggregates

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.personal_models = server.state.declare("personal", initial=server.model.initial_params)

    def begin_round(self, round: int) -> None:
        """Message passing over the round's clients: their cloud models u_i from their stored personal models."""
        clients = self.select_clients(round)
        models = self.personal_models.read(clients)
        sq_distances = squared_distances(models)
        xi = attention_weights(sq_distances, self.alpha_k, self.scale(len(clients)))
        self.cloud = dict(zip(clients, cloud_models(models, xi)))
        if len(clients) > 1:
            others = ~torch.eye(len(clients), dtype=torch.bool, device=xi.device)
            self.log("fedamp/sq_distance_mean", float(sq_distances[others].mean()))
        self.log("fedamp/self_weight_mean", float(xi.diagonal().mean()))
        self.log("fedamp/self_weight_min", float(xi.diagonal().min()))

    def scale(self, clients: int) -> float:
        """sigma for a round of `clients` clients: the given one, or alpha_k (clients - 1), the smallest that keeps
        every xi_ii >= 0 whatever the distances (A' <= 1 / sigma)."""
        return self.sigma if self.sigma is not None else self.alpha_k * max(clients - 1, 1)

    def client_model(self, client: int) -> Tensor:
        """What `client` trains from: its cloud model u_i in a round that built one for it, else its personal w_i."""
        cloud = self.cloud.get(client)
        return self.personal_models[client] if cloud is None else cloud

    def newcomer_models(self, newcomers: Newcomers) -> tuple[ClientModels, Tensor, None]:
        """Each newcomer gets the stored personal model w_i with the lowest loss on its training split."""
        models = ClientModels(lambda client: self.personal_models[client], self.server.num_clients)
        return models, best_fitting(newcomers, models), None

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The proximal step from the cloud models `starts`: the module's SGD with (lam / alpha_k)(w - u_i) added
        to every gradient."""
        hook = None
        if self.lam:
            pull = self.lam / self.alpha_k
            hook = lambda rows, params, grad, cloud: grad.add_(params - cloud, alpha=pull)  # noqa: E731
        return self.server.clients.train_many(
            round, clients, starts, lr_scale=self.learning_rate_scale(round), gradient_hook=hook
        )

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Each client's trained model becomes its personal model w_i (the clients left out keep theirs)."""
        held = updates.all()
        self.personal_models.write(held.clients, held.params)

    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        self.cloud = {}  # the round's cloud models are spent

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        """Every client is evaluated with its personal model w_i."""
        n = self.server.num_clients
        return ClientModels(self.personal_models.__getitem__, n), torch.arange(n, device=self.server.device)
