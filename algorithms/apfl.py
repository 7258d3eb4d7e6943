"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020: Algorithm 1, with the
gradient update of the mixing weight alpha that the paper gives beside it).

Each client i keeps a local model v_i and a mixing weight alpha_i; its personalized model is
v_bar_i = alpha_i v_i + (1 - alpha_i) w. At every local step, on one batch:

    w       <- w - eta grad f_i(w)                      (the global model's local update, plain SGD)
    v_i     <- v_i - eta alpha_i grad f_i(v_bar_i)      (the gradient of f_i(v_bar_i) with respect to v_i)
    alpha_i <- clip(alpha_i - eta_alpha <v_i - w, grad f_i(v_bar_i)>, 0, 1)   (when `adaptive`)

with v_bar_i, v_i and w of the step's start on the right-hand sides (the updates of a step are simultaneous, as in
Algorithm 1), and one batch for the w step and the v step. The server averages the trained w's (FedAvg); each
client is evaluated with its v_bar_i.

How it maps onto fedlight: the local loop is the algorithm's own group loop (`train_group`), built from
`server.clients.group_batches` (the batches the module's SGD would take, for a group of clients at once) and
`server.model.group_loss_and_grad` (every client's gradient of a step in one vectorized call when the plan allows). v_i
and alpha_i are per-client state (the client states "local" and "alpha"): the client sends them back beside w
(`Updates.state`) and the engine stores them, gathered over the processes, so every process reaches the same state; they
are saved in the checkpoint. A step works on views of the group's rows of w and v when they are consecutive (they are
but for clients with a short last batch) and builds the personalized models a row at a time, so it holds w, v, their
two gradients and the personalized models: a few (clients, parameters) matrices of the group, no copies of them.

Defaults: alpha = 0.5, the initial mixing weight of the authors' released implementation (FedTorch);
adaptive = True, alpha updated at every local step as in the paper's update; alpha_lr = None: alpha steps with the
clients' learning rate eta, the step size of the paper's update (and of that implementation). v_i starts from
the initial model, as w does.

Deviations and limits:

- the w and v steps are plain SGD at the module's configured learning rate of the round (times
  `learning_rate_scale`): the optimizer's momentum and weight decay are not applied (the paper's Algorithm 1 is
  plain SGD), nor a scheduler stepping within a round;
- the server's average is fedlight's FedAvg, weighted by training-set size (the paper averages unweighted);
- the authors' code adds a penalty 0.01 alpha^2 to the alpha step and updates alpha once per round; we follow the
  paper's update, every step, without it;
- buffers (BatchNorm running statistics) are not updated by this loop (`loss_and_grad` returns the gradient only):
  they keep their initial values, so use a network without BatchNorm (a warning says so);
- the reported training loss is the global model's (w's), as FedAvg's.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def row_range(rows: list[int]) -> slice | list[int]:
    """`rows` as a slice when they are consecutive (indexing then gives views, not copies), else the list."""
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return rows


def personalized(alpha: Tensor, local: Tensor, shared: Tensor) -> Tensor:
    """(k, d) alpha_i v_i + (1 - alpha_i) w_i of k clients (alpha: (k, 1)), a row at a time into the result: the
    products and sums of the whole expression, with one row's temporary instead of two (k, d) ones."""
    out = torch.empty_like(local)
    for row, a, v, w in zip(out, alpha, local, shared):
        torch.mul(a, v, out=row).add_((1 - a) * w)
    return out


class APFL(Algorithm):
    """Adaptive personalized FL: a global model averaged by the server, and per client a local model and an
    adaptive mixing weight.

    Args:
        alpha: every client's initial mixing weight, in [0, 1] (0: the personalized model is the global one).
        adaptive: update each alpha_i by gradient descent at every local step; False keeps it fixed.
        alpha_lr: step size of the alpha update (> 0); None: the clients' learning rate.
        participation: share of clients selected each round.
    """

    def __init__(
        self, alpha: float = 0.5, adaptive: bool = True, alpha_lr: float | None = None, participation: float = 1.0
    ) -> None:
        super().__init__(participation)
        if not 0 <= alpha <= 1:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        if alpha_lr is not None and not alpha_lr > 0:
            raise ValueError(f"alpha_lr must be > 0 (or None: the clients' learning rate), got {alpha_lr}")
        self.initial_alpha, self.adaptive, self.alpha_lr = alpha, adaptive, alpha_lr

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        if not bool(server.model.parameter_mask().all()):
            warnings.warn(
                "APFL's local loop does not update buffers (BatchNorm running statistics): they keep "
                "their initial values; use a network without BatchNorm",
                stacklevel=2,
            )
        self.local = server.state.declare("local", initial=server.model.initial_params)
        self.alpha = server.state.declare("alpha", initial=self.models.new_tensor(self.initial_alpha))

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Algorithm 1's local steps for a group of clients at once (`server.clients.group_batches`, each step's
        gradients of every client in one `server.model.group_loss_and_grad`): (trained w's, mean loss of each w over its
        last epoch, {"local": v's, "alpha": alphas})."""
        server = self.server
        rate = server.clients.learning_rate(round) * self.learning_rate_scale(round)
        alpha_rate = rate if self.alpha_lr is None else self.alpha_lr
        w, v, alpha = starts.clone(), self.local.read(clients), self.alpha.read(clients)
        loss_sum, steps = torch.zeros(len(clients), device=w.device), torch.zeros(len(clients), device=w.device)
        for group in server.clients.group_batches(round, clients):
            rows = group.rows
            if group.step == 0:
                loss_sum[rows], steps[rows] = 0, 0
            at = row_range(rows)  # a run of rows: views of w and v, updated in place; else copies, written back
            w_rows, v_rows, a_rows = w[at], v[at], alpha[rows][:, None]
            loss, grad_w = server.model.group_loss_and_grad(w_rows, group.batch, group.step)
            _, grad_mixed = server.model.group_loss_and_grad(
                personalized(a_rows, v_rows, w_rows), group.batch, group.step
            )
            grad_alpha = torch.stack([torch.dot(a, b) for a, b in zip(v_rows - w_rows, grad_mixed)])
            w_rows.sub_(grad_w, alpha=rate)
            v_rows.sub_(grad_mixed.mul_(a_rows * rate))
            del grad_w, grad_mixed
            if not isinstance(at, slice):
                w[rows], v[rows] = w_rows, v_rows
            if self.adaptive:
                alpha[rows] = (alpha[rows] - alpha_rate * grad_alpha).clamp(0, 1)
            loss_sum[rows] += loss
            steps[rows] += 1
        return Trained(w, loss_sum / steps.clamp(min=1), {}, {"local": v, "alpha": alpha})

    def personalized_model(self, client: int) -> Tensor:
        """v_bar_i = alpha_i v_i + (1 - alpha_i) w."""
        alpha = self.alpha[client]
        return alpha * self.local[client] + (1 - alpha) * self.models[0]

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        n = self.server.num_clients
        return ClientModels(self.personalized_model, n), torch.arange(n, device=self.server.device)

    def round_metrics(self) -> dict[str, float]:
        return {"apfl/alpha_mean": float(self.alpha.read(torch.arange(self.server.num_clients)).mean())}
