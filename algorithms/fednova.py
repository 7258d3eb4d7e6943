"""FedNova (Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020), section 4 (the normalized averaging, eq. 7) with the local momentum of section 5.

When clients take different numbers of local steps tau_i (more data, faster devices, work cut short by a deadline),
FedAvg's weighted mean of the updates over-weights the clients that stepped more, and the fixed point it converges to
is that of a surrogate objective weighted by p_i tau_i, not the true one. FedNova divides each update by the sum of
the coefficients its local optimizer put on its gradients, ||a_i||_1, then rescales the weighted mean of these
normalized updates by the effective step count tau_eff = sum_i p_i ||a_i||_1:

    x <- x + tau_eff sum_i p_i (y_i - x) / ||a_i||_1,     p_i = n_i / sum_j n_j over the round's clients.

||a_i||_1 is tau_i for plain SGD; with heavy-ball momentum rho (PyTorch's SGD, dampening 0) the gradient of step k
moves the model by eta (1 - rho^(tau_i - k)) / (1 - rho) by the end, so ||a_i||_1 = [tau_i - rho (1 - rho^tau_i) /
(1 - rho)] / (1 - rho) (section 5). With equal tau_i FedNova is FedAvg.

How it maps onto fedlight: clients run FedAvg's local SGD unchanged; each counts the steps it actually took
(`server.clients.steps_this_round`: the system model's partial work cuts them) and sends ||a_i||_1 beside its model
(`fednova_steps`, a statistic the server sums: DP refuses it, as the step counts reach the server unnoised). The server
combines the rows x + (y_i - x) / ||a_i||_1 through the run's cluster aggregator (so a robust rule or a server
optimizer applies to the normalized updates) and scales the result's step by tau_eff.

Defaults and deviations:
- the weights p_i are training-set sizes, as the paper's experiments (and FedAvg here);
- only SGD is normalized (the paper's analysis covers SGD with momentum and proximal terms); another optimizer, or
  Nesterov momentum, is refused in one line, and weight decay is left out of a_i (its contraction of the model is
  not a gradient coefficient);
- a learning-rate schedule that changes within a round (`interval: "step"`) makes ||a_i||_1 approximate: it counts
  steps, not their rates;
- buffers (BatchNorm statistics) are averaged as FedAvg does, not normalized: they are not moved by gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.plugin import SUMMED, Algorithm, RoundUpdates, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

STEPS = "fednova_steps"


def gradient_coefficient_sum(steps: Tensor, momentum: float) -> Tensor:
    """||a_i||_1 for each client's `steps` local steps of SGD with heavy-ball `momentum` rho (0: plain SGD):
    [tau - rho (1 - rho^tau) / (1 - rho)] / (1 - rho), which is tau at rho = 0."""
    tau = steps.to(torch.float64)
    if momentum == 0:
        return tau
    rho = momentum
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


class FedNova(Algorithm):
    """FedAvg's local SGD; the server averages the updates normalized by each client's local step count and steps
    by the effective count (see the module docstring).

    Args:
        participation: share of clients selected each round.
    """

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        kind, settings = server.clients.optimizer_settings()
        if kind != "SGD" or settings.get("nesterov", False):
            raise ValueError(
                f"FedNova normalizes by the local steps of SGD with heavy-ball momentum; the module's "
                f"optimizer is {kind}{' with Nesterov momentum' if kind == 'SGD' else ''}: configure "
                "model.optimizer: sgd without nesterov"
            )
        self.momentum = float(settings.get("momentum", 0.0))
        self.parameter_entries = server.model.parameter_mask().to(server.device)
        server.message.sends(STEPS, SUMMED)  # ||a_i||_1: tau_eff is their p-weighted sum

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """FedAvg's local work; each client also sends ||a_i||_1 of the steps it took."""
        trained = super().train_group(round, clients, starts)
        steps = torch.tensor([self.server.clients.steps_this_round(c) for c in clients], device=starts.device)
        coefficients = gradient_coefficient_sum(steps, self.momentum).to(starts.dtype)
        return Trained(trained.params, trained.loss, trained.logs, {**trained.state, STEPS: coefficients})

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """x <- x + tau_eff (A - x), A the run's aggregate (the p-weighted mean) of the rows x + (y_i - x) / ||a_i||_1,
        streamed over the groups of updates."""
        models = self.models
        average = self.server.aggregation.new(len(models), models.shape[1], models.dtype, models.device, None)
        size_sum = torch.zeros(len(models), dtype=torch.float64, device=models.device)
        weighted_steps = torch.zeros_like(size_sum)  # sum of n_i ||a_i||_1 per cluster
        for group in updates.groups():
            coefficients = group.state[STEPS].to(torch.float64)
            sizes = group.num_samples.to(torch.float64)
            clusters = self.assignment[group.clients]
            normalized = torch.addcdiv(
                group.starts, group.params - group.starts, coefficients.clamp(min=1e-12).to(models.dtype)[:, None]
            )
            normalized = torch.where(self.parameter_entries, normalized, group.params)  # buffers: FedAvg's mean
            average.add(clusters, sizes.to(models.dtype), normalized, group.starts)
            size_sum.index_add_(0, clusters, sizes)
            weighted_steps.index_add_(0, clusters, sizes * coefficients)
            del group, normalized
        average.reduce(updates)
        updates.sum_over_processes_(size_sum, weighted_steps)
        active, means = average.means()
        if not len(active):
            return
        tau_eff = (weighted_steps[active] / size_sum[active].clamp(min=1e-300))[:, None]
        x = models[active].to(torch.float64)
        stepped = (x + tau_eff * (means.to(torch.float64) - x)).to(models.dtype)
        self.models[active] = torch.where(self.parameter_entries, stepped, means)
        self.log("fednova/tau_eff", float(tau_eff.mean()))
