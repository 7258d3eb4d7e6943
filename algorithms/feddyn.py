"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, "Federated Learning Based on Dynamic Regularization",
ICLR 2021), Algorithm 1.

Each client k keeps the gradient of its loss at its last local model, g_k (client state, zero at first), and minimizes
a dynamically regularized objective from the server model theta^{t-1}:

    L_k(theta) - <g_k, theta> + (alpha / 2) ||theta - theta^{t-1}||^2,

whose gradient is the loss's gradient - g_k + alpha (theta - theta^{t-1}). At the trained theta_k^t the first-order
condition gives the new state g_k <- g_k - alpha (theta_k^t - theta^{t-1}). The server keeps h (zero at first):

    h^t     = h^{t-1} - alpha (1 / m) sum_{k in P_t} (theta_k^t - theta^{t-1})     (m: every client),
    theta^t = (1 / |P_t|) sum_{k in P_t} theta_k^t - h^t / alpha.

At a fixed point every client's stationarity matches the global one's, whatever the heterogeneity: the linear term
cancels the drift that FedAvg's local steps accumulate.

How it maps onto fedlight:
- the objective's extra terms are one fused edit of the (clients, d) gradients of a group after every backward pass
  (the module's SGD, vectorized); g_k of the group's clients is read once per round from its client-state store
  (`feddyn_gradients`, spilled to disk past the memory budget at cross-device scale) and the new g_k is returned under
  the store's name, so the engine writes it after the round (at the update's arrival under FedBuff) and it never leaves
  the client;
- the server's mean of the theta_k is the run's cluster aggregator with every client counted once (the paper's
  unweighted mean), so DP noises it, a robust rule replaces it and a server optimizer steps it; h and theta then
  follow the two lines above from that aggregate.

Defaults: alpha = 0.01, the value of the authors' code (`alpha_coef`) and the middle of the paper's grid
{0.1, 0.01, 0.001}.

Deviations and limits:
- alpha is the same for every client, as Algorithm 1 (the authors' code divides it by each client's share of the
  data, alpha / (n_k m / n); equal shares make the two the same);
- the terms act on parameters only: buffers (BatchNorm statistics) have no gradient, so their entries of g_k and h stay
  zero and their new value is the clients' plain mean;
- with momentum in the local optimizer the first-order condition behind g_k's update holds only approximately; the
  configs use plain SGD, as the paper.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, Plan, RoundUpdates, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

GRADIENTS = "feddyn_gradients"


class FedDyn(Algorithm):
    """Dynamic regularization: a linear term from each client's last gradient and a proximal term in the local
    objective, a server state h that corrects the average (see the module docstring).

    Args:
        alpha: weight of the dynamic regularizer (> 0; 0.01 in the authors' code).
        participation: share of clients selected each round.
    """

    plan = Plan(corrects_gradient=True)

    def __init__(self, alpha: float = 0.01, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not alpha > 0:
            raise ValueError(f"FedDyn's alpha must be > 0, got {alpha}: it weighs the regularizer and divides h")
        self.alpha = alpha
        self.h = torch.empty(0)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.h = self.models.new_zeros(server.model.num_params)
        self.gradients = server.state.declare(GRADIENTS, initial=self.models.new_zeros(server.model.num_params))
        self.parameter_entries = server.model.parameter_mask().to(server.device)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The module's SGD with gradient - g_k + alpha (theta - theta^{t-1}), then g_k - alpha (theta_k - theta^{t-1})
        returned for the client's store."""
        linear = self.gradients.read(clients)  # (clients, d), a copy: updated in place below
        alpha, everyone = self.alpha, list(range(len(clients)))

        def regularized(rows: list[int], params: Tensor, grad: Tensor, begin: Tensor) -> None:
            at = linear if rows == everyone else linear[rows]  # the whole call in one group: no copy a step
            grad.sub_(at).add_(params, alpha=alpha).sub_(begin, alpha=alpha)

        trained = self.server.clients.train_many(
            round, clients, starts, lr_scale=self.learning_rate_scale(round), gradient_hook=regularized
        )
        moved = torch.sub(trained.params, starts).masked_fill_(~self.parameter_entries, 0)
        new = linear.sub_(moved, alpha=alpha)
        del moved
        return Trained(trained.params, trained.loss, trained.logs, {**trained.state, GRADIENTS: new})

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """h <- h - alpha (|P| / m) (mean - theta), theta <- mean - h / alpha, the mean the run's aggregate of the
        trained models, every client counted once."""
        models = self.models
        average = self.server.aggregation.new(len(models), models.shape[1], models.dtype, models.device, None)
        received = torch.zeros(1, dtype=torch.float64, device=models.device)
        for group in updates.groups():
            average.add(
                self.assignment[group.clients],
                torch.ones(len(group), dtype=models.dtype, device=models.device),
                group.params,
                group.starts,
            )
            received += len(group)
            del group
        average.reduce(updates)
        updates.sum_over_processes_(received)
        active, means = average.means()
        if not len(active):
            return
        theta, mean = models[0].to(torch.float64), means[0].to(torch.float64)
        share = float(received) / self.server.num_clients
        h = self.h.to(torch.float64) - self.alpha * share * (mean - theta)
        h.masked_fill_(~self.parameter_entries, 0)
        self.h = h.to(models.dtype)
        self.models[0] = (mean - h / self.alpha).to(models.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "h": self.h}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.h = state["h"]
