r"""FedEM (Marfoq, Neglia, Bellet, Kameni, Vidal: "Federated Multi-Task Learning under a Mixture of Distributions",
NeurIPS 2021; section 3, Algorithm 1 "FedEM").

Every client's data distribution is a mixture of M shared components: client t has mixture weights pi_t (a point of
the simplex), component m a model theta_m. In a round, each selected client t, on its training samples (x_i, y_i):
- E-step: q_t(z_i = m) proportional to pi_tm exp(-l(theta_m; x_i, y_i)) (l the cross-entropy);
- M-step: pi_tm = the mean of q_t(z_i = m) over its samples;
- trains every component m from the server's theta_m on its data with the per-sample weights q_t(z_i = m) (the
  batch mean of weight x cross-entropy, `ServerContext.clients.train(..., sample_weights=...)`).
The server averages each component over the clients, weighted by training-set size, through the engine's cluster
aggregator: each component is a cluster, and every trained client adds one row to each, its copy trained from the
server's component, so a configured robust rule (`aggregator.rule`) or DP (`privacy:`) applies per component.
The model a client sends beside its copies is its copy of the component it started from (`client_model`: its most
likely component), and it replaces that copy in the average; an update attack (`attack:`) rewrites every copy,
each measured from the component it was trained from (the copies are a model entry of known origin,
`fedlight.plugin.message`). Under DP the unit of privacy stays the client: its M copies' updates are clipped to
C / sqrt(M) each, so together they have norm at most C, the M noised sums are one Gaussian mechanism of noise
multiplier z, and the accountant steps once a round at the rate of clients selected (`fedlight.aggregators.privacy`).
A client predicts with its mixture, p(y | x) = sum_m pi_tm p_m(y | x) (the evaluation model is a callable returning
its logarithm); the cluster it is logged with is the argmax of its weights.

Defaults: M = 3 components, as in the paper's experiments; mixture weights start uniform; component 0
starts from the run's initial model and the others from independent random initializations (identical components
would stay identical; the authors' code seeds each component's network differently too). With M = 1 every weight is
1 and the round is exactly FedAvg's (same training, same averaging). When only some clients train a round
(`participation` below 1, `federation.clients_per_round`), each component is averaged as the authors' code
(`CentralizedAggregator.mix`) averages it: over every client, by training-set size, a client that did not train
counting with its copy of the previous component, i.e. theta_m <- (received weight x the clients' mean +
the other clients' weight x theta_m) / all clients' weight; `average: sampled` averages the round's clients alone,
as FedAvg does. The paper's experiments train every client every round, where the two are the same.

Deviations:
- the local solver is the module's optimizer at the configured learning rate (the paper's is SGD; its scripts use
  momentum 0.9 and weight decay 5e-4, and each client's momentum buffer lives on across rounds), and the E-step's
  losses are computed in evaluation mode (dropout off);
- fine-tuning before evaluation (`federation.finetune_epochs`) needs a flat model, which a mixture is not: it is not
  supported for M > 1.

Separation. On the digits rotations (`configs/digits/fedem.yaml`: 20 clients in 4 rotations, M = 4, the digits
configs' shared lr 0.05, 2 local epochs, 30 rounds) the components do not separate: ARI 0.0 and 0.78 test accuracy at
round 30, against FedAvg's 0.85. The M-step is gradient steps on the batch mean of q x loss, so a component learns at
a rate proportional to its responsibilities; they start at 1/M, so every component trains at about lr / M, and the
one whose random start fits the data first gains weight in every client's mixture (one network fits all four
rotations, so it is the better one on each), then trains fastest, while the others' weights, and with them their
training, fade: from round 11 every client's largest weight is on that one component. The steps that decide this
follow the authors' code (the E-step on the training samples under the current components, pi the mean posterior,
the weighted loss, differently seeded starts), and M = 1 is FedAvg exactly. The authors give FedEM a learning rate 3
to 5 times FedAvg's (their CIFAR-10 and EMNIST scripts: 0.03 and 0.05 against 0.01); at lr 0.2 (4 x 0.05) FedEM
reaches 0.928 at round 30 (worst client 0.688), above FedAvg, and the 180-degree clients move to a component of their
own (ARI 0.30), but the other three rotations still share one. Where there are two rotations to tell apart the
components do separate at the shared lr: 8 clients in 2 rotations with M = 2, ARI 1.0 from round 9 and 0.966 at
round 30:
    python -m fedlight fit --config configs/digits/fedem.yaml --model.init_args.lr 0.2
    python -m fedlight fit --config configs/digits/fedem.yaml --data.init_args.num_clients 8 \
        --data.init_args.partition.init_args.num_clusters 2 --algorithm.init_args.num_components 2

A client that arrives after training fits its mixture weights on its training data by EM with the components fixed
(`fit_mixture_weights`), and predicts with its mixture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedlight.plugin import (
    MODEL,
    ROUTING,
    Algorithm,
    ClientModels,
    GroupModels,
    Newcomers,
    RoundUpdates,
    Trained,
    Updates,
)

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

AVERAGES = ("all_clients", "sampled")  # FedEM(average=...): see the class


def posterior(log_weights: Tensor, losses: Tensor) -> Tensor:
    """The E-step: (samples, M) q(z_i = m) = pi_m exp(-l_mi) / sum_k pi_k exp(-l_ki), from log pi ((M,), or
    (samples, M) for one mixture per sample) and the losses (M, samples)."""
    return torch.softmax(log_weights - losses.T, dim=1)


def fit_mixture_weights(
    losses: Tensor, owner: Tensor, count: int, iterations: int = 200, tolerance: float = 1e-8
) -> Tensor:
    """(count, M) mixture weights of `count` clients fitted by EM with the components fixed, from every component's
    loss on every sample (losses: (M, samples)) and the client of each sample (owner: (samples,)): from uniform
    weights, alternate the E-step and pi = the mean posterior over each client's samples."""
    m = len(losses)
    weights = torch.full((count, m), 1.0 / m, dtype=torch.float64, device=losses.device)
    counts = torch.bincount(owner, minlength=count).clamp(min=1).to(torch.float64)[:, None]
    for _ in range(iterations):
        q = posterior(weights.log()[owner], losses.to(torch.float64))
        new = torch.zeros_like(weights).index_add_(0, owner, q) / counts
        done = bool((new - weights).abs().max() < tolerance)
        weights = new
        if done:
            break
    return weights


def copy_rows(params: Tensor, copies: Tensor, component: Tensor) -> Tensor:
    """(clients * M, d) every client's copies of components 0..M-1, a row each, client after client: the block its
    `FedEM.train_group` trained (copies: (clients, M, d)) with, at each client's start component (component:
    (clients,)), the model it sent (params: (clients, d)), which an update attack may have replaced. Written into
    the block in place, so the rows are a view of it (no second copy of the group's models); with one component the
    block is a view of params itself and nothing is written."""
    k, m, d = copies.shape
    if params.untyped_storage().data_ptr() != copies.untyped_storage().data_ptr():
        copies[torch.arange(k, device=copies.device), component] = params
    return copies.reshape(k * m, d)


def mix_in_previous(previous: Tensor, means: Tensor, received: Tensor, total: Tensor) -> Tensor:
    """The components as the authors' server averages them under client sampling: every client's copy weighted by
    its weight in the component (FedEM: its training-set size), a client not received counting with the previous
    component, i.e. (received x the received clients' mean + (total - received) x previous) / total, per component
    (received, total: (components,) float64). The means themselves when every client's weight was received
    (exactly: the round then is the plain average)."""
    if bool((received >= total).all()):
        return means
    received, total = received[:, None], total[:, None]
    mixed = (received * means.to(torch.float64) + (total - received) * previous.to(torch.float64)) / total
    return mixed.to(means.dtype)


class MixturePredictor:
    """A client's mixture as an evaluation model: raw inputs -> log sum_m pi_m softmax(theta_m(x))."""

    def __init__(self, predict: Callable[[Tensor, Tensor], Tensor], components: Tensor, log_weights: Tensor) -> None:
        self.predict, self.components, self.log_weights = predict, components, log_weights

    def component_log_weights(self, x: Tensor) -> Tensor:
        """(M, 1, 1) log pi_m, the same for every sample (FedGMM's depend on x: (M, samples, 1))."""
        return self.log_weights[:, None, None]

    def __call__(self, x: Tensor) -> Tensor:
        log_probs = torch.stack([F.log_softmax(self.predict(theta, x), dim=-1) for theta in self.components])
        return torch.logsumexp(log_probs + self.component_log_weights(x).to(log_probs.dtype), dim=0)


class FedEM(Algorithm):
    """M shared component models and per-client mixture weights, learned by federated EM.

    Args:
        num_components: M, the number of components (1: FedAvg).
        participation: share of clients per round.
        average: how a component is averaged when only some clients train a round. "all_clients" (the authors'
            code): over every client, weighted by training-set size, a client that did not train (or was left out)
            counting with the previous component; "sampled": over the round's clients alone, as FedAvg averages.
            The same with every client in every round (the paper's experiments).
    """

    def __init__(
        self,
        num_components: int = 3,
        participation: float = 1.0,
        average: Literal["all_clients", "sampled"] = "all_clients",
    ) -> None:
        super().__init__(participation)
        if num_components < 1:
            raise ValueError(f"algorithm.init_args.num_components must be >= 1, got {num_components}")
        if average not in AVERAGES:
            raise ValueError(f"algorithm.init_args.average must be one of {', '.join(AVERAGES)}, got {average!r}")
        self.num_components, self.average = num_components, average

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.message.sends(
            "copies",
            MODEL,  # its trained copy of every component, from the components
            trained_from=lambda clients: self.models.expand(len(clients), -1, -1),
        )
        server.message.sends("component", ROUTING)  # the component it started from, the server's assignment
        m = self.num_components
        if m > server.num_clients:
            raise ValueError(
                f"algorithm.init_args.num_components is {m}, more than the {server.num_clients} "
                f"clients: give at most {server.num_clients}"
            )
        seeds = server.random.rng(0, "fedem-components").integers(2**31, size=m)
        self.models = torch.stack(
            [server.model.initial_params] + [server.model.random_params(int(s)) for s in seeds[1:]]
        )
        self.mixture = server.state.declare("mixture", initial=self.initial_mixture())

    def initial_mixture(self) -> Tensor:
        """A client's mixture weights before it trains: uniform over the M components."""
        return self.models.new_full((self.num_components,), 1.0 / self.num_components)

    def sample_losses(self, client: int) -> Tensor:
        """(M, samples) every component's cross-entropy on each of the client's training samples."""
        return self.server.clients.sample_losses(self.models, [client])[0]

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """E-step, M-step of the mixture weights, and every component's weighted training, one group call per
        component. The model a client sends is its trained copy of the component it started from (`client_model`:
        its most likely one, `assignment`), so an update attack acts on it as on every copy; the state holds
        every copy ("copies", (clients, M, d)), that component's index ("component") and the new pi_t ("mixture",
        which the engine stores). The loss is the sum over components of their weighted losses."""
        if self.num_components == 1:
            trained = super().train_group(round, clients, starts)
            trained.state = {
                "copies": trained.params[:, None],
                "component": self.assignment[clients],
                "mixture": self.mixture.read(clients),
            }
            return trained
        q = [self.responsibilities(c) for c in clients]
        trained = self.train_components(round, clients, starts, q)
        trained.state["mixture"] = torch.stack([qc.mean(dim=0) for qc in q]).to(self.mixture.dtype)
        trained.state.update(self.responsibility_state(clients, q))
        return trained

    def responsibilities(self, client: int) -> Tensor:
        """The E-step: (samples, M) q(z_i = m) on the client's training samples under its mixture weights."""
        return posterior(self.mixture[client].log(), self.sample_losses(client))

    def responsibility_state(self, clients: list[int], q: list[Tensor]) -> dict[str, Tensor]:
        """Per-client rows a client sends beside its mixture, computed from its responsibilities (a subclass's:
        FedRC's label mass); FedEM sends none."""
        return {}

    def train_components(self, round: int, clients: list[int], starts: Tensor, q: list[Tensor]) -> Trained:
        """Every component trained from the server's on each client's data with per-sample weights (q: a (samples,
        M) tensor a client), one group call per component; the model sent is each client's copy of its start
        component, the state its copies ("copies") and that component's index ("component"), the loss the sum of
        the components' weighted losses."""
        component = self.assignment[clients]  # starts[i] is self.models[component[i]]
        scale = self.learning_rate_scale(round)
        copies = starts.new_empty(len(clients), *self.models.shape)  # each client's copies, written as trained
        losses = []
        for m, theta in enumerate(self.models):
            part = self.server.clients.train_many(
                round, clients, theta.expand(len(clients), -1), lr_scale=scale, sample_weights=[qc[:, m] for qc in q]
            )
            copies[:, m] = part.params
            losses.append(part.loss)
            del part  # one component's trained models beside the block, never all of them
        sent = copies[torch.arange(len(clients), device=copies.device), component]
        return Trained(sent, torch.stack(losses).sum(dim=0), {}, {"copies": copies, "component": component})

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Each component becomes the training-set-size weighted mean of the clients' trained copies (a client with a
        non-finite copy is left out by the engine), the model each client sent written back over its copy of its
        start component; under `average: all_clients` a round without every client then mixes in the previous
        component with the weight of the clients not received. Every trained client's mixture weights are stored.
        A group's copies are added as they are held (one (clients, M, d) block), with the starts built only for an
        aggregator that reads them, so memory holds the group's copies once."""
        m, d = self.models.shape
        # the run's cluster aggregator, a component a cluster: the weighted mean, or the configured rule or DP
        average = self.server.aggregation.new(m, d, self.models.dtype, self.models.device, rows_per_client=m)
        components = torch.arange(m, device=self.models.device)
        received = torch.zeros(m, dtype=torch.float64, device=self.models.device)  # weight received, summed
        for group in updates.groups():  # the block and indices are popped: not kept to the round's end, not stored
            weights = self.component_weights(group)  # (clients, M), before the copies leave the state
            rows = copy_rows(group.params, group.state.pop("copies"), group.state.pop("component"))
            k = len(group)  # a client's rows: its copies of components 0..M-1, and their starts
            average.add(
                components.repeat(k),
                weights.to(self.models.dtype).reshape(-1),
                rows,
                self.models.repeat(k, 1) if average.reads_starts else None,
            )
            received += weights.to(torch.float64).sum(dim=0)
            del group, rows
        average.reduce(updates)
        active, means = average.means()
        if self.average == "all_clients":
            updates.sum_over_processes_(received)
            means = mix_in_previous(self.models[active], means, received[active], self.total_weights(updates)[active])
        self.set_shared(active, means)
        clients, weights = updates.state("mixture")  # stored by the engine after the round
        self.assignment[clients] = self.component_shares(weights).argmax(dim=1)

    def component_weights(self, group: Updates) -> Tensor:
        """(clients, M) each trained client's weight in each component's average: its training-set size."""
        return group.num_samples[:, None].expand(-1, self.num_components)

    def total_weights(self, updates: RoundUpdates) -> Tensor:
        """(M,) float64 every client's weight in each component, summed (`average: all_clients`)."""
        return self.server.clients.train_sizes.to(torch.float64).sum().expand(self.num_components)

    def component_shares(self, mixture: Tensor) -> Tensor:
        """(clients, M) how much of each client's data each component models, from its stored mixture rows: pi_t
        itself (FedGMM's rows are joint weights, summed here over the Gaussians)."""
        return mixture

    def mixture_predictor(self, log_weights: Tensor) -> MixturePredictor:
        """A client's evaluation model: the components mixed with weights exp(`log_weights`)."""
        return MixturePredictor(self.server.model.predict, self.models, log_weights)

    def evaluation_models(self) -> tuple[GroupModels, Tensor]:
        """Every client predicts with its mixture (one component: the component itself, as FedAvg)."""
        if self.num_components == 1:
            return super().evaluation_models()
        n = self.server.num_clients
        predictors = ClientModels(lambda c: self.mixture_predictor(self.mixture[c].log()), n)
        return predictors, torch.arange(n, device=self.server.device)

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Any, Tensor, Tensor]:
        """Each newcomer's mixture weights fitted on its training data with the components fixed
        (`newcomer_weights`); it predicts with its mixture, and its cluster is its largest component share."""
        weights = self.newcomer_weights(newcomers)
        clusters = self.component_shares(weights).argmax(dim=1).to(self.models.device)
        if self.num_components == 1:
            return self.models, clusters, clusters
        models = [self.mixture_predictor(w.log()) for w in weights]
        return models, torch.arange(newcomers.count, device=self.models.device), clusters

    def newcomer_weights(self, newcomers: Newcomers) -> Tensor:
        """(newcomers, M) mixture weights fitted by EM on each newcomer's training data, the components fixed."""
        losses, owner = newcomers.sample_losses(self.models)
        return fit_mixture_weights(losses, owner, newcomers.count)

    def cluster_labels(self) -> np.ndarray:
        return self.assignment.cpu().numpy()
