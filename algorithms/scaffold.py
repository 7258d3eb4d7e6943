"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020, Algorithm 1 with option II of the client control variate).

The server keeps a control variate c (d,) and every client one, c_i (client state). A client of round r starts from the
server model x and takes its K local steps (`server.clients.steps_this_round(client)`: fewer when the system model
cuts its work short) at the learning rate eta_l
(`server.clients.learning_rate(r)`) with the corrected gradient g + c - c_i, reaching y_i; option II then sets
c_i+ = c_i - c + (x - y_i) / (K eta_l). The server applies x <- x + eta_g mean(y_i - x) and
c <- c + (|S| / N) mean(c_i+ - c_i) over the |S| clients of the round (N clients in all).

How it maps onto fedlight:

- the correction is a gradient hook (`corrects_gradient`): clients still run the module's own SGD, vectorized;
- c_i+ is computed by the client, as the paper's, from the x and c it trained with (`train_group`), and returned
  under its client-state store's name (`client_controls`): the engine writes it into the client's row after the
  round (when its update arrives, under FedBuff). The server reads the returned rows to sum c_i+ - c_i into c
  (the store still holds the old c_i during the round), so the entry is declared a summed statistic
  (`fedlight.plugin.message`): DP refuses it (c is broadcast unnoised), and under FedBuff a stale client's change
  arrives as it computed it, from the x and c it was sent. c and c_i are saved in the checkpoint.

Defaults: server learning rate eta_g = 1, the paper's default (the server step is then the plain mean of the
clients' models), every client in every round; control variates start at zero.

Deviations and limits (none in the update rules themselves):

- the means over clients are unweighted, as in the paper's Algorithm 1, unlike fedlight's FedAvg, which weights
  by training-set size: with eta_g = 1 and zero control variates a round is the unweighted mean of the trained
  models;
- option II assumes plain SGD steps: (x - y_i) / (K eta_l) is then the mean corrected gradient. With a momentum
  optimizer (the digits configs use momentum 0.5) the same formula overestimates it, by up to 1 / (1 - momentum);
  we apply it unchanged, as the paper's formula is written;
- eta_l is the round's rate at its first local step (times `learning_rate_scale`); a scheduler stepping within a
  round (`interval: "step"`) makes it approximate;
- control variates exist for parameters only: buffers (BatchNorm statistics) have no gradient, so their entries
  of c and c_i stay zero, and their new value is the plain mean of the clients' (eta_g does not extrapolate them).

Early rounds on a CNN: on the digits label-skew config (2 classes a client, momentum 0 as option II wants) SCAFFOLD
trails FedAvg at the same optimizer early (mean test accuracy 0.359 against 0.502 at round 10, 0.626 against 0.735
at round 20) and leads it later (0.865 against 0.835 at round 40, 0.913 against 0.898 at round 60; seed 0,
`python -m fedlight fit --config configs/digits/skew/scaffold.yaml` and `fedavg.yaml --model.init_args.momentum 0`).
The control variates of the first rounds are estimated along the nonconvex early trajectory and correct towards
stale directions; FedAvg's momentum 0.5 in the family's other configs doubles its effective step, which accounts for
the rest of the gap at 20 rounds. On a convex problem the variance reduction shows from the start:
tests/algorithms/test_pfl_drift_and_mixing.py checks that under label skew SCAFFOLD reaches a lower global training
loss than FedAvg in 10 rounds of softmax regression.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedlight.plugin import SUMMED, Algorithm, Plan, RoundUpdates, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class SCAFFOLD(Algorithm):
    """SCAFFOLD with option II control variates, computed by each client.

    Args:
        server_lr: the global step size eta_g (> 0; 1 in the paper).
        participation: share of clients selected each round.
    """

    plan = Plan(corrects_gradient=True)

    def __init__(self, server_lr: float = 1.0, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {server_lr}")
        self.server_lr = server_lr
        self.control = torch.empty(0)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        d = server.model.num_params
        self.control = self.models.new_zeros(d)
        self.client_controls = server.state.declare("client_controls", initial=self.models.new_zeros(d))
        server.message.sends("client_controls", SUMMED)  # c_i+, kept by the client; c_i+ - c_i summed into c
        self.parameter_entries = server.model.parameter_mask().to(server.device)
        self.training_controls: dict[int, Tensor] = {}  # c_i of the clients training now: read once, not every step

    def local_gradient(self, client: int, params: Tensor, grad: Tensor, start: Tensor) -> None:
        """g + c - c_i."""
        if client not in self.training_controls:
            self.training_controls[client] = self.client_controls[client]
        grad.add_(self.control).sub_(self.training_controls[client])

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The module's SGD with the corrected gradient, then each client's option II variate
        c_i+ = c_i - c + (x - y_i) / (K eta_l), from the x it started from and the c it trained with."""
        trained = super().train_group(round, clients, starts)
        for client in clients:  # trained: its c_i is not needed again this round
            self.training_controls.pop(client, None)
        old = self.client_controls.read(clients)  # a copy: written in place below
        rate = self.server.clients.learning_rate(round) * self.learning_rate_scale(round)
        steps = torch.tensor([self.server.clients.steps_this_round(c) for c in clients], device=starts.device)
        scale = (steps * rate).to(starts.dtype)[:, None]
        drift = torch.sub(starts, trained.params).div_(scale).masked_fill_(~self.parameter_entries, 0)  # in place: a
        new = old.sub_(self.control).add_(drift)  # group of large models holds few (clients x parameters) copies
        del drift
        return Trained(trained.params, trained.loss, trained.logs, {**trained.state, "client_controls": new})

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """x <- x + eta_g mean(y_i - x) and c <- c + sum(c_i+ - c_i) / N, streamed over the groups of updates (the
        store holds every c_i until the engine writes the returned c_i+ after the round)."""
        x = self.models[0]
        total = torch.zeros(1, dtype=torch.float64, device=x.device)  # |S|: clients received
        model_sum = torch.zeros_like(x, dtype=torch.float64)  # sum of y_i
        control_change = torch.zeros_like(x, dtype=torch.float64)  # sum of c_i+ - c_i
        for group in updates.groups():
            old = self.client_controls.read(group.clients)
            total += len(group)
            model_sum += group.params.sum(0, dtype=torch.float64)
            control_change += (group.state["client_controls"] - old).sum(0, dtype=torch.float64)
            del group, old
        self.training_controls.clear()  # those of clients left out
        updates.sum_over_processes_(total, model_sum, control_change)
        if total.item() == 0:
            return
        x64 = x.double()
        step = model_sum / total - x64  # mean(y_i - x)
        step = torch.where(self.parameter_entries, self.server_lr * step, step)
        self.models[0] = (x64 + step).to(x.dtype)
        self.control += (control_change / self.server.num_clients).to(x.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "control": self.control}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.control = state["control"]
