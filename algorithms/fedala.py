"""FedALA: "FedALA: Adaptive Local Aggregation for Personalized Federated Learning" (Zhang, Hua, Wang, Song, Xue, Ma,
Guan; AAAI 2023), section "Method", "Adaptive Local Aggregation (ALA)", and Algorithm 1.

Before its local training, a selected client i builds its starting model from the global model Theta it received
and its own local model theta_i (the model it trained when it last took part), element-wise:

    theta_hat_i = theta_i + (Theta - theta_i) * W_i      on the top p layers (parameters only)
    theta_hat_i = Theta                                   on the lower layers (and on every buffer)

with W_i in [0, 1], one weight per entry, learned by the client on a random s % sample of its training data: at each
batch of the sample, from the current theta_hat_i,

    W_i <- clip(W_i - eta * grad_theta L(theta_hat_i) * (Theta - theta_i), 0, 1),   then theta_hat_i anew

(the chain rule: the gradient of the loss with respect to W is the gradient with respect to theta_hat times
Theta - theta_i; `ala_step`). W_i starts at ones (theta_hat = Theta). At the client's first ALA step, W_i trains pass
after pass over the same sample until its loss settles (the standard deviation of the last `num_pre_loss` passes'
losses, each the loss of a pass's last batch, below `threshold`, or `max_start_passes` passes); at later ones, one pass.
The client then trains theta_hat_i with the module's SGD (`server.clients.train_many`), sends the trained model, which
the server averages (the engine's FedAvg), and keeps its top layers as its new theta_i. ALA is skipped, as in the
authors' code, while theta_i equals Theta on the mixed entries (the first round: both are the initial model); the
client then starts from Theta and its first ALA step is still to come.

How it maps onto fedlight: theta_i (the trained model's mixed entries) and W_i are client states ("local",
"weights"), and whether W_i has had its first, converging ALA step a third ("weights_learned"); only the mixed
entries are stored, since the lower layers always come from the global model. The clients return them beside their
models and the engine stores them. W learning is a group loop over the round's clients: the sample's batches come
from `server.clients.group_batches` (stream "ala"), every batch's gradients of the group from one
`server.model.group_loss_and_grad`, and the convergence loop runs as that group too: each pass goes over the clients
still learning, so a client that has settled, or has had its one later pass, leaves it. `train/ala_passes` and
`train/ala_weight_mean` report each client's passes and mean W of the round.

Evaluation, by default (`evaluate_after_ala: false`, what the shipped configs and the README's tables use): every
client is evaluated with the ALA aggregation of the current global model and its stored theta_i with its stored W_i,
lower layers global (`personalized_model`), computed as (1 - W) theta + W Theta, which is Theta exactly where W = 1.
That is the model it would start from in its next round before that round's W pass; a client never selected has
W = 1 and is evaluated with the global model, exactly. The authors' code (and PFLlib) evaluate after the ALA step of a
round, which learns W afresh on every client from the current global model; `evaluate_after_ala: true` does that
(`relearned_model`: an ALA step from the stored W, one pass for a client whose W was learned before, the converging
first step otherwise, on a sample drawn from a stream of its own so training is unchanged), at the cost of a pass
over every client's sample at every evaluation. Nothing it learns is kept: the next round's ALA starts from the
stored W, as without it. A newcomer (a held-out client) gets the global model (the inherited `newcomer_models`).

Defaults: eta = 1.0 (the paper's setting and PFLlib's default), rand_percent s = 80 (the paper's and PFLlib's),
layers p = 1 (the paper's setting; PFLlib's default layer_idx = 2 counts parameter tensors, the last layer's weight
and bias, which is the same one layer here, and a half count here takes its bias alone, layer_idx = 1),
threshold = 0.1 and num_pre_loss = 10 (PFLlib's ALA module's defaults, which its FedALA client keeps). The paper's
values of eta, s and p are as we recall its experimental setup (its hyperparameter study varies s and p); the
paper's text was not at hand to check them. max_start_passes = 100 is ours: PFLlib's loop has no cap, and a loss
that never settles below the threshold would stall the run.

Deviations from the authors' code (PFLlib's FedALA), and why:
- ALA runs on the round's clients when they are selected (Algorithm 1's clients); the authors' server runs it on
  every client in every round, which would make a round's cost grow with all clients. A client first selected in
  a later round therefore mixes the global model with the initial model (its theta_i, the paper's theta_i^0 =
  Theta^0), as a client not trained in the first round does at its first ALA step in the authors' code.
- The sample is a uniformly random s % of the client's training data (the first int(s/100 * n) samples of a random
  order, the count PFLlib takes, in whole batches: the short last one dropped, our choice, so that every client's ALA
  step is a full batch and a group's steps run together; PFLlib's utils/ALA.py keeps it, `drop_last=False`), fixed
  within a round's passes; PFLlib takes a contiguous window at a random offset. A sample smaller than one batch is
  one short batch here.
- ALA is skipped when theta_i equals Theta on every mixed entry; PFLlib compares the first parameter tensor's sum.
- Buffers (BatchNorm statistics) are the global model's; PFLlib's local model keeps its own buffers.
- The mix is computed as (1 - W) theta + W Theta (the same value up to float rounding, exact at W = 0 and W = 1).
- Local training is the module's own optimizer (momentum, weight decay, schedulers as configured); PFLlib's is plain
  SGD. W's steps are plain gradient steps of size eta, as PFLlib's.
- The server's average is fedlight's FedAvg, weighted by training-set size, as PFLlib's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def mix(local: Tensor, received: Tensor, weights: Tensor) -> Tensor:
    """ALA's aggregation on the mixed entries: theta + (Theta - theta) * W, as (1 - W) theta + W Theta."""
    return (1 - weights) * local + weights * received


def ala_step(weights: Tensor, grad: Tensor, difference: Tensor, eta: float) -> Tensor:
    """One update of W from the gradient `grad` of the loss at theta_hat (on the mixed entries) and
    `difference` = Theta - theta: clip(W - eta * grad * difference, 0, 1)."""
    return (weights - eta * grad * difference).clamp_(0, 1)


class FedALA(Algorithm):
    """FedALA: each selected client starts its local training from an element-wise, learned mix of the global model
    and its own last local model on the top layers (the global model below them); the server averages (FedAvg).

    Args:
        eta: learning rate of the aggregation weights W (>= 0; 0 keeps W at ones: FedAvg).
        rand_percent: s, the percentage of a client's training data W learns on, in (0, 100].
        layers: p, how many layers, counted from the output, are mixed (> 0 and at most the network's layers; a half
            count takes half of the boundary layer, `ServerContext.model.layer_count_mask`).
        threshold: the first ALA step of a client stops when the standard deviation of its last `num_pre_loss`
            pass losses is below this (>= 0).
        num_pre_loss: how many of the last pass losses that standard deviation covers (>= 1).
        max_start_passes: the most passes of the first ALA step (>= 1).
        evaluate_after_ala: evaluate each client after an ALA step learned afresh from the current global model
            (the authors' and PFLlib's evaluation); False: with its W of its last participation (see above).
        participation: share of clients selected each round.
    """

    def __init__(
        self,
        eta: float = 1.0,
        rand_percent: float = 80.0,
        layers: float = 1,
        threshold: float = 0.1,
        num_pre_loss: int = 10,
        max_start_passes: int = 100,
        evaluate_after_ala: bool = False,
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if not eta >= 0:
            raise ValueError(f"eta must be >= 0 (the aggregation weights' learning rate), got {eta}")
        if not 0 < rand_percent <= 100:
            raise ValueError(
                f"rand_percent must be in (0, 100] (the percentage of a client's training data W learns "
                f"on), got {rand_percent}"
            )
        if not layers > 0 or (2 * layers) % 1:
            raise ValueError(
                f"layers must be a whole or half number of layers > 0 (p, the top layers ALA mixes), got {layers}"
            )
        if not threshold >= 0:
            raise ValueError(f"threshold must be >= 0, got {threshold}")
        if int(num_pre_loss) != num_pre_loss or num_pre_loss < 1:
            raise ValueError(f"num_pre_loss must be an integer >= 1, got {num_pre_loss}")
        if int(max_start_passes) != max_start_passes or max_start_passes < 1:
            raise ValueError(f"max_start_passes must be an integer >= 1, got {max_start_passes}")
        self.eta, self.rand_percent, self.layers, self.threshold = eta, rand_percent, layers, threshold
        self.num_pre_loss, self.max_start_passes = int(num_pre_loss), int(max_start_passes)
        self.evaluate_after_ala = evaluate_after_ala
        self.round = 0  # the round last begun: an evaluation's ALA step draws its sample from that round's stream

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        names = server.model.layers()
        if self.layers > len(names):
            raise ValueError(
                f"layers must be at most the network's {len(names)} layers ({', '.join(names)}), got {self.layers}"
            )
        self.mixed = server.model.layer_count_mask(self.layers, "last") & server.model.parameter_mask()
        initial = server.model.initial_params[self.mixed]
        self.local = server.state.declare("local", initial=initial)  # theta_i^0 = Theta^0
        self.weights = server.state.declare("weights", initial=torch.ones_like(initial))
        self.weights_learned = server.state.declare("weights_learned", initial=initial.new_zeros(()))

    def begin_round(self, round: int) -> None:
        self.round = round

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """ALA for the group (W learned by `learn_weights` where theta_i differs from Theta), then the module's SGD
        from theta_hat: (trained models, their losses, {"local", "weights", "weights_learned"})."""
        mixed = self.mixed
        local, weights = self.local.read(clients), self.weights.read(clients)
        learned = self.weights_learned.read(clients)
        received = starts[:, mixed]
        active = (local != received).any(dim=1).nonzero().flatten().tolist()
        passes = starts.new_zeros(len(clients))
        initialized = starts.clone()
        if active:
            weights[active], passes[active] = self.learn_weights(
                round, [clients[r] for r in active], starts[active], local[active], weights[active], learned[active] > 0
            )
            learned[active] = 1
            top = initialized[active]
            top[:, mixed] = mix(local[active], received[active], weights[active])
            initialized[active] = top
        trained = self.server.clients.train_many(round, clients, initialized, lr_scale=self.learning_rate_scale(round))
        trained.logs = {**trained.logs, "ala_passes": passes, "ala_weight_mean": weights.mean(dim=1)}
        trained.state = {"local": trained.params[:, mixed], "weights": weights, "weights_learned": learned}
        return trained

    def learn_weights(
        self,
        round: int,
        clients: list[int],
        starts: Tensor,
        local: Tensor,
        weights: Tensor,
        learned: Tensor,
        purpose: str = "ala",
    ) -> tuple[Tensor, Tensor]:
        """W of each client after its ALA step: passes over its s % sample (`sample_batches`), one for a client
        whose W has been learned before (`learned`), else until its pass losses settle or `max_start_passes`;
        `purpose` names the sample's stream. Returns (W, passes of each client)."""
        server, mixed = self.server, self.mixed
        difference = starts[:, mixed] - local  # Theta - theta
        weights = weights.clone()
        sample = self.sample_batches(round, clients, purpose)
        going = sorted({row for rows, _, _ in sample for row in rows})  # a client with no sample keeps its W
        history: list[Tensor] = []  # each pass's last-batch loss of every client (NaN: not in that pass)
        passes = starts.new_zeros(len(clients))
        while going:
            last = starts.new_full((len(clients),), float("nan"))
            for rows, batch, step in sample:
                keep = [i for i, row in enumerate(rows) if row in going]
                if not keep:
                    continue
                at = [rows[i] for i in keep]
                params = starts[at].clone()
                params[:, mixed] = mix(local[at], starts[at][:, mixed], weights[at])
                loss, grad = server.model.group_loss_and_grad(params, (batch[0][keep], batch[1][keep]), step)
                weights[at] = ala_step(weights[at], grad[:, mixed], difference[at], self.eta)
                last[at] = loss.to(last.dtype)
            history.append(last)
            passes[going] += 1
            going = self.still_learning(going, learned, torch.stack(history, dim=1), passes)
        return weights, passes

    def still_learning(self, going: list[int], learned: Tensor, history: Tensor, passes: Tensor) -> list[int]:
        """The clients of `going` that take another pass: those in their first ALA step whose last `num_pre_loss`
        pass losses (`history`: clients x passes) have a standard deviation of `threshold` or more (or that have
        no more than `num_pre_loss` passes yet), below `max_start_passes` passes."""
        n = self.num_pre_loss
        spread = (
            history[:, -n:].std(dim=1, unbiased=False)
            if history.shape[1] > n
            else torch.full_like(passes, float("inf"))
        )
        unsettled = (~learned) & ~(spread < self.threshold) & (passes < self.max_start_passes)
        return [row for row in going if bool(unsettled[row])]

    def sample_batches(
        self, round: int, clients: list[int], purpose: str = "ala"
    ) -> list[tuple[list[int], tuple[Tensor, Tensor], int]]:
        """Each client's s % sample as batches, in the order of its "ala" stream of the round (`group_batches`): of
        the first int(s / 100 * n) samples of a random order of its n training samples, the whole batches at the
        federation's batch size (the short last one dropped, where PFLlib's loader keeps it: see the module
        docstring; a sample smaller than one batch is one batch). A list of (the clients' positions, their batches
        stacked, the step)."""
        left = [int(self.rand_percent / 100 * n) for n in self.server.clients.train_sizes[clients].tolist()]
        started = [False] * len(clients)
        batches = []
        for group in self.server.clients.group_batches(round, clients, epochs=1, purpose=purpose):
            if not any(left):
                break
            x, y = group.batch
            takes: dict[int, list[int]] = {}
            for i, row in enumerate(group.rows):
                if not started[row] and left[row] >= len(y[i]):  # whole batches of the client's first batch's size
                    left[row] -= left[row] % len(y[i])
                started[row] = True
                take = min(len(y[i]), left[row])
                if take:
                    takes.setdefault(take, []).append(i)
                    left[row] -= take
            for take, keep in takes.items():
                batches.append(([group.rows[i] for i in keep], (x[keep, :take], y[keep, :take]), group.step))
        return batches

    def personalized_model(self, client: int) -> Tensor:
        """The global model with ALA's aggregation of its stored theta_i and W_i on the mixed entries (the global
        model exactly for a client never selected: W_i = 1)."""
        model = self.models[0].clone()
        model[self.mixed] = mix(self.local[client], model[self.mixed], self.weights[client])
        return model

    def relearned_model(self, client: int) -> Tensor:
        """PFLlib's evaluated model: the global model with ALA's aggregation on the mixed entries after an ALA step
        learned now from the current global model (from the stored W; stream "ala-eval" of the round last begun),
        nothing stored. The global model for a client whose theta_i equals it (never selected)."""
        received = self.models[0]
        local = self.local[client]
        if not bool((local != received[self.mixed]).any()):
            return received.clone()
        learned = self.weights_learned[client][None] > 0
        weights, _ = self.learn_weights(
            self.round, [client], received[None], local[None], self.weights[client][None], learned, "ala-eval"
        )
        model = received.clone()
        model[self.mixed] = mix(local, received[self.mixed], weights[0])
        return model

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        """Every client its own model (`relearned_model` with `evaluate_after_ala`, else `personalized_model`)."""
        n = self.server.num_clients
        model = self.relearned_model if self.evaluate_after_ala else self.personalized_model
        return ClientModels(model, n), torch.arange(n, device=self.server.device)
