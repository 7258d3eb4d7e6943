"""FedEM (Marfoq, Neglia, Bellet, Kameni, Vidal: "Federated Multi-Task Learning under a Mixture of Distributions",
NeurIPS 2021; section 3, Algorithm 1 "FedEM").

Every client's data distribution is a mixture of M shared components: client t has mixture weights pi_t (a point of
the simplex), component m a model theta_m. In a round, each selected client t, on its training samples (x_i, y_i):
- E-step: q_t(z_i = m) proportional to pi_tm exp(-l(theta_m; x_i, y_i)) (l the cross-entropy);
- M-step: pi_tm = the mean of q_t(z_i = m) over its samples;
- trains every component m from the server's theta_m on its data with the per-sample weights q_t(z_i = m) (the
  batch mean of weight x cross-entropy, `ServerContext.train(..., sample_weights=...)`).
The server averages each component over the clients, weighted by training-set size, through the engine's cluster
aggregator: each component is a cluster, and every trained client adds one row to each, its copy trained from the
server's component, so a configured robust rule (`federation.aggregator`) or DP (`privacy:`) applies per component.
Under DP the unit of privacy stays the client: its M copies' updates are clipped to C / sqrt(M) each, so together
they have norm at most C, the M noised sums are one Gaussian mechanism of noise multiplier z, and the accountant steps
once a round at the rate of clients selected (`fedlight.aggregators.privacy`). A client predicts with its
mixture, p(y | x) = sum_m pi_tm p_m(y | x) (the evaluation model is a callable returning its logarithm); the cluster
it is logged with is the argmax of its weights.

Defaults: M = 3 components, as in the paper's experiments; mixture weights start uniform; component 0
starts from the run's initial model and the others from independent random initializations (identical components
would stay identical). With M = 1 every weight is 1 and the round is exactly FedAvg's (same training, same
averaging).

Deviations:
- the local solver is the module's optimizer at the configured learning rate (the paper's is SGD), and the E-step's
  losses are computed in evaluation mode (dropout off);
- fine-tuning before evaluation (`federation.finetune_epochs`) needs a flat model, which a mixture is not: it is not
  supported for M > 1.

A client that arrives after training fits its mixture weights on its training data by EM with the components fixed
(`fit_mixture_weights`), and predicts with its mixture.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, Newcomers, RoundUpdates, Trained


def posterior(log_weights: Tensor, losses: Tensor) -> Tensor:
    """The E-step: (samples, M) q(z_i = m) = pi_m exp(-l_mi) / sum_k pi_k exp(-l_ki), from log pi ((M,), or
    (samples, M) for one mixture per sample) and the losses (M, samples)."""
    return torch.softmax(log_weights - losses.T, dim=1)


def fit_mixture_weights(losses: Tensor, owner: Tensor, count: int, iterations: int = 200,
                        tolerance: float = 1e-8) -> Tensor:
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


def copy_rows(params: Tensor, others: Tensor) -> Tensor:
    """(clients * M, d) every client's copies of components 0..M-1, a row each, client after client, from its copy
    of component 0 (params: (clients, d)) and of the others ((clients, M - 1, d)). A view when both are still the
    slices of the one (clients, M, d) block `FedEM.train_group` wrote them in, else (an update attack replaced
    params, the engine left a client out) a concatenation."""
    k, others_count, d = others.shape
    if others_count == 0:
        return params
    m = others_count + 1
    one_block = (params.untyped_storage().data_ptr() == others.untyped_storage().data_ptr()
                 and params.stride() == (m * d, 1) and others.stride() == (m * d, d, 1)
                 and others.storage_offset() == params.storage_offset() + d)
    if one_block:
        return params.as_strided((k * m, d), (d, 1), params.storage_offset())
    return torch.cat([params[:, None], others], dim=1).reshape(-1, d)


class MixturePredictor:
    """A client's mixture as an evaluation model: raw inputs -> log sum_m pi_m softmax(theta_m(x))."""

    def __init__(self, predict: Callable[[Tensor, Tensor], Tensor], components: Tensor, log_weights: Tensor) -> None:
        self.predict, self.components, self.log_weights = predict, components, log_weights

    def __call__(self, x: Tensor) -> Tensor:
        log_probs = torch.stack([F.log_softmax(self.predict(theta, x), dim=-1) for theta in self.components])
        return torch.logsumexp(log_probs + self.log_weights.to(log_probs.dtype)[:, None, None], dim=0)


class FedEM(Algorithm):
    """M shared component models and per-client mixture weights, learned by federated EM.

    Args:
        num_components: M, the number of components (1: FedAvg).
        participation: share of clients per round.
    """

    def __init__(self, num_components: int = 3, participation: float = 1.0) -> None:
        super().__init__(participation)
        if num_components < 1:
            raise ValueError(f"algorithm.init_args.num_components must be >= 1, got {num_components}")
        self.num_components = num_components

    def setup(self, server) -> None:
        super().setup(server)
        m = self.num_components
        if m > server.num_clients:
            raise ValueError(f"algorithm.init_args.num_components is {m}, more than the {server.num_clients} "
                             f"clients: give at most {server.num_clients}")
        seeds = server.rng(0, "fedem-components").integers(2**31, size=m)
        self.models = torch.stack([server.initial_params] + [server.random_params(int(s)) for s in seeds[1:]])
        self.mixture = server.client_state("mixture", initial=self.models.new_full((m,), 1.0 / m))

    def sample_losses(self, client: int) -> Tensor:
        """(M, samples) every component's cross-entropy on each of the client's training samples."""
        return self.server.clients.sample_losses(self.models, [client])[0]

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """E-step, M-step of the mixture weights, and every component's weighted training, one group call per
        component: (component 0, the sum over components of their weighted losses, {"others": components 1..M-1,
        "mixture": the new pi_t, which the engine stores})."""
        if self.num_components == 1:
            trained = super().train_group(round, clients, starts)
            trained.state = {"others": starts.new_zeros(len(clients), 0, starts.shape[1]),
                             "mixture": self.mixture.read(clients)}
            return trained
        q = [posterior(self.mixture[c].log(), self.sample_losses(c)) for c in clients]
        scale = self.learning_rate_scale(round)
        copies = starts.new_empty(len(clients), *self.models.shape)  # each client's copies, written as trained
        losses = []
        for m, theta in enumerate(self.models):
            part = self.server.train_many(round, clients, theta.expand(len(clients), -1), lr_scale=scale,
                                          sample_weights=[qc[:, m] for qc in q])
            copies[:, m] = part.params
            losses.append(part.loss)
            del part  # one component's trained models beside the block, never all of them
        return Trained(copies[:, 0], torch.stack(losses).sum(dim=0), {}, {
            "others": copies[:, 1:], "mixture": torch.stack([qc.mean(dim=0) for qc in q]).to(self.mixture.dtype)})

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """Each component becomes the training-set-size weighted mean of the clients' trained copies (a client with a
        non-finite copy is left out by the engine: its "others" rows are state it sent); every trained client's
        mixture weights are stored. A group's copies are added as they are held (one (clients, M, d) block), with
        the starts built only for an aggregator that reads them, so memory holds the group's copies once."""
        m, d = self.models.shape
        # the run's cluster aggregator, a component a cluster: the weighted mean, or the configured rule or DP
        average = self.server.cluster_aggregator(m, d, self.models.dtype, self.models.device, rows_per_client=m)
        components = torch.arange(m, device=self.models.device)
        for group in updates.groups():
            rows = copy_rows(group.params, group.state.pop("others"))  # not kept to the round's end: not stored
            k = len(group)  # a client's rows: its copies of components 0..M-1, and their starts
            average.add(components.repeat(k), group.num_samples.to(self.models.dtype).repeat_interleave(m), rows,
                        self.models.repeat(k, 1) if average.reads_starts else None)
            del group, rows
        average.reduce(updates)
        self.set_shared(*average.means())
        clients, weights = updates.state("mixture")  # stored by the engine after the round
        self.assignment[clients] = weights.argmax(dim=1)

    def mixture_predictor(self, log_weights: Tensor) -> MixturePredictor:
        return MixturePredictor(self.server.predict, self.models, log_weights)

    def evaluation_models(self) -> tuple[Tensor | ClientModels, Tensor]:
        """Every client predicts with its mixture (one component: the component itself, as FedAvg)."""
        if self.num_components == 1:
            return super().evaluation_models()
        n = self.server.num_clients
        predictors = ClientModels(lambda c: self.mixture_predictor(self.mixture[c].log()), n)
        return predictors, torch.arange(n, device=self.server.device)

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Any, Tensor, Tensor]:
        """Each newcomer's mixture weights fitted on its training data with the components fixed; it predicts with
        its mixture, and its cluster is its largest weight."""
        losses, owner = newcomers.sample_losses(self.models)
        weights = fit_mixture_weights(losses, owner, newcomers.count)
        clusters = weights.argmax(dim=1).to(self.models.device)
        if self.num_components == 1:
            return self.models, clusters, clusters
        models = [self.mixture_predictor(w.log()) for w in weights]
        return models, torch.arange(newcomers.count, device=self.models.device), clusters

    def cluster_labels(self) -> np.ndarray:
        return self.assignment.cpu().numpy()
