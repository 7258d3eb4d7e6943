r"""FedGMM (Wu, Zhang, Yu, Liu, Gu, Zhou, Chen, Cheng: "Personalized Federated Learning under Mixture of
Distributions", ICML 2023; section 3, the federated EM of its Algorithm 1).

Client t's joint density is a mixture over M1 Gaussians of the inputs and K conditional models:
p_t(x, y) = sum_{m, k} pi_t[m, k] N(e(x); mu_m, Sigma_m) p_{theta_k}(y | x), with the Gaussians and the models
shared and the weights pi_t (an (M1, K) point of the simplex) the client's own. In a round, each selected client, on
its training samples (x_i, y_i):
- E-step: q_i[m, k] proportional to pi_t[m, k] N(e(x_i); mu_m, Sigma_m) exp(-l(theta_k; x_i, y_i)), l the
  cross-entropy (FedEM's `posterior` over the M1 x K pairs, the density folded into each pair's loss);
- M-step: pi_t = the mean of q_i over its samples; its Gaussians' weighted statistics, per m: sum_i w_im,
  sum_i w_im e_i and sum_i w_im e_i e_i^T with w_im = sum_k q_i[m, k], sent to the server; every conditional model
  k trained from the server's theta_k with the per-sample weights sum_m q_i[m, k], as FedEM trains its components
  (`FedEM.train_components`).
The server sums the statistics and sets mu_m and Sigma_m from them (the closed-form M-step, exactly the centralized
EM's on the pooled data, `gaussians_from_statistics`), and averages each conditional model through the engine's
cluster aggregator (FedEM's `aggregate`: a component a cluster, so a robust rule or DP applies per model), each
client weighted by its responsibility mass sum_i sum_m q_i[m, k] = n_t sum_m pi_t[m, k], as the authors' server
weighs them (`ACGCentralizedAggregator.mix`). A client predicts with the paper's rule, p(y | x) = p(x, y) / p(x):
sum_k p_t(k | x) p_{theta_k}(y | x) with p_t(k | x) proportional to sum_m pi_t[m, k] N(e(x); mu_m, Sigma_m)
(`GaussianMixturePredictor`); its logged cluster, and the model it sends and an update attack rewrites, is its most
used conditional model, argmax_k sum_m pi_t[m, k].

The embedding e(x). The authors embed images with a frozen ImageNet-pretrained ResNet-18 followed by a PCA matrix
they compute offline on the pooled data (`resnet_pca`, `PCA.pkl`, its first `embedding_dimension` = 32 columns), and
use the inputs themselves on synthetic data. fedlight has no pretrained weights offline and never pools the clients'
data, so e(x) is a PCA of the inputs as the model sees them, flattened: every client sends once, before round 1, the
count, sum and sum of outer products of its training inputs; the server adds them and takes the top eigenvectors
of the pooled covariance (`pca_projection`), e(x) = (x - mean) V. It is frozen, as the authors' encoder is, and
costs (input features)^2 numbers per client once (a 64 x 64 matrix on the digits); the statistics are sent in the
clear, as PACFL's subspaces are.

Defaults: M1 = 3 Gaussians, K = 3 conditional models, a 32-dimensional embedding and a covariance regularization
of 0.1 added to the diagonal, the authors' (`--n_gmm`, `--n_learners`, `--embedding_dimension`, the GMM's `eps`;
the regularization is in the embedding's units: the digits' first PCA variances run from 0.7 down to 0.015 at the
32nd). Full covariances, as the authors' `GaussianMixture` (its default "full"). The weights start uniform,
1 / (M1 K); the conditional models as FedEM's components (model 0 the run's initial model, the others seeded
apart); the Gaussians from the pooled embedding's moments: each mean a draw from N(0, Lambda), each covariance
Lambda (Lambda the PCA's variances), from a (seed, purpose) stream. Under client sampling, as FedEM's
`average: all_clients` and the authors' server, which loops over every client: a conditional model mixes in its
previous value with the weight of the clients not received (the server keeps every client's n_t pi_t summed, updated
by the round's clients, so the work grows with the round's clients), and a Gaussian mixes in the previous Gaussian's
moments with that weight; `average: sampled` takes the round's clients alone.

Deviations:
- the embedding, above; and the Gaussians start from the pooled moments where the authors' clients start each from a
  k-means of their own data (whose components the server then averages by index);
- the server's Gaussians are those of the summed statistics; the authors' server averages the clients' means and
  covariances (each about the client's own mean) by n_t sum_k pi_t[m, k], which leaves out the spread of the clients'
  means; both are closed form, and with one client they are the same fit;
- the authors' prediction adds pi_t to the log-densities (`predict_gmm`), not log pi_t; here the paper's rule;
- the statistics are sums, not passed through the robust rule or DP, so a run with a `privacy:` section is refused
  in one line (its accounting would cover the conditional models alone, not the Gaussians' statistics or the
  embedding's moments);
- a Gaussian with no responsibility in a round keeps its previous value; the authors add eps to the counts too;
- as FedEM: the module's optimizer as the local solver, losses in evaluation mode, no fine-tuning for K > 1.

A client that arrives after training fits its weights pi (M1 x K) by EM with the Gaussians and the models fixed
(FedEM's `fit_mixture_weights` on the pairs' losses with the densities folded in), and predicts with the paper's rule;
the authors' unseen-client script runs E-steps with the global Gaussians and models (`unseen_step`), where the weights
here are fitted to convergence, as FedEM's newcomers' are.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Literal

import torch
from torch import Tensor

from fedlight.algorithms.fedem import FedEM, MixturePredictor, fit_mixture_weights, posterior
from fedlight.plugin import SUMMED, Newcomers, RoundUpdates, Trained, Updates

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

#: rows a client's inputs are converted and embedded at a time
CHUNK_ROWS = 4096


def moment_statistics(x: Tensor, weights: Tensor) -> Tensor:
    """(M, 1 + d + d * d) per column m of `weights` ((n, M)) the weighted count, sum and sum of outer products of the
    rows of x ((n, d)), in float64: what a client sends for a Gaussian's M-step (and, with one column of ones, for
    the PCA of its inputs)."""
    x, w = x.to(torch.float64), weights.to(torch.float64)
    count = w.sum(dim=0)[:, None]
    first = w.T @ x
    second = torch.stack([(x * w[:, m, None]).T @ x for m in range(w.shape[1])]).flatten(1)  # no (n, d, d) block
    return torch.cat([count, first, second], dim=1)


def unpack(statistics: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(count (M,), sum (M, d), sum of outer products (M, d, d)) from `moment_statistics`' rows."""
    d = int(math.isqrt(statistics.shape[1] - 1))  # 1 + d + d^2 columns: d = floor(sqrt(columns - 1))
    return statistics[:, 0], statistics[:, 1 : 1 + d], statistics[:, 1 + d :].reshape(-1, d, d)


def gaussians_from_statistics(statistics: Tensor) -> tuple[Tensor, Tensor]:
    """The closed-form M-step: (means (M, d), covariances (M, d, d)) mu = S1 / N, Sigma = S2 / N - mu mu^T from
    summed `moment_statistics` (a row with N = 0 gives NaN: the caller keeps its previous Gaussian)."""
    count, first, second = unpack(statistics)
    means = first / count[:, None]
    return means, second / count[:, None, None] - means[:, :, None] * means[:, None, :]


def pca_projection(statistics: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """(mean (D,), basis (D, dim), variances (dim,)) of the inputs whose summed `moment_statistics` (one row) are
    given: the top-`dim` eigenvectors of the pooled covariance, largest variance first."""
    means, covariances = gaussians_from_statistics(statistics)
    variances, vectors = torch.linalg.eigh(covariances[0])
    order = variances.argsort(descending=True)[:dim]
    return means[0], vectors[:, order], variances[order].clamp(min=0.0)


def gaussian_log_densities(e: Tensor, means: Tensor, covariances: Tensor) -> Tensor:
    """(n, M) log N(e_i; mu_m, Sigma_m) of every row of e ((n, d)) under every Gaussian, through Cholesky factors."""
    factors = torch.linalg.cholesky(covariances)  # (M, d, d)
    centred = (e[None, :, :] - means[:, None, :]).transpose(1, 2)  # (M, d, n)
    solved = torch.linalg.solve_triangular(factors, centred, upper=False)
    log_det = 2.0 * torch.log(torch.diagonal(factors, dim1=1, dim2=2)).sum(dim=1)  # (M,)
    d = e.shape[1]
    return (-0.5 * (d * math.log(2 * math.pi) + log_det[:, None] + (solved**2).sum(dim=1))).T


def pair_losses(losses: Tensor, log_densities: Tensor) -> Tensor:
    """(M1 * K, n) l_k(i) - log N_m(e_i) for every pair (m, k), m-major: a pair's loss with its Gaussian's density
    folded in, so FedEM's `posterior` and `fit_mixture_weights` over the pairs are FedGMM's E-step (losses: (K, n),
    log_densities: (n, M1))."""
    return (losses[None, :, :] - log_densities.T[:, None, :]).flatten(0, 1)


def joint_posterior(log_weights: Tensor, log_densities: Tensor, losses: Tensor) -> Tensor:
    """The E-step: (n, M1, K) q_i[m, k] = pi[m, k] N_m(e_i) exp(-l_k(i)) / sum over the pairs, from log pi ((M1, K)),
    the log-densities ((n, M1)) and the models' losses ((K, n))."""
    m1, k = log_weights.shape
    return posterior(log_weights.flatten(), pair_losses(losses, log_densities)).view(-1, m1, k)


def conditional_log_weights(log_weights: Tensor, log_densities: Tensor) -> Tensor:
    """(n, K) log p(k | x_i) = log sum_m pi[m, k] N_m(e(x_i)) - log sum_{m, k} of the same: how much each conditional
    model speaks for x_i (log_weights: (M1, K), log_densities: (n, M1))."""
    joint = log_weights[None, :, :] + log_densities[:, :, None]
    return torch.logsumexp(joint, dim=1) - torch.logsumexp(joint.flatten(1), dim=1, keepdim=True)


class GaussianMixturePredictor(MixturePredictor):
    """A client's mixture as an evaluation model: raw inputs -> log sum_k p(k | x) softmax(theta_k(x)), p(k | x)
    from its weights and the Gaussians of the embedded inputs (the paper's p(y | x) = p(x, y) / p(x))."""

    def __init__(
        self,
        predict: Callable[[Tensor, Tensor], Tensor],
        components: Tensor,
        log_weights: Tensor,
        embed: Callable[[Tensor], Tensor],
        means: Tensor,
        covariances: Tensor,
    ) -> None:
        super().__init__(predict, components, log_weights)
        self.embed, self.means, self.covariances = embed, means, covariances

    def component_log_weights(self, x: Tensor) -> Tensor:
        densities = gaussian_log_densities(self.embed(x), self.means, self.covariances)
        return conditional_log_weights(self.log_weights.to(densities.dtype), densities).T[:, :, None]


class FedGMM(FedEM):
    """K conditional models, M1 Gaussians of an embedding of the inputs, and per-client joint weights over the pairs,
    learned by federated EM.

    Args:
        num_components: K, the conditional models p(y | x) (FedEM's components).
        num_gaussians: M1, the Gaussians of the inputs' embedding.
        embedding_dim: the PCA embedding's dimension (at most the input features).
        covariance_regularization: added to every covariance's diagonal (> 0), in the embedding's units.
        participation: share of clients per round.
        average: "all_clients" (the authors' server) or "sampled", as FedEM's.
    """

    def __init__(
        self,
        num_components: int = 3,
        num_gaussians: int = 3,
        embedding_dim: int = 32,
        covariance_regularization: float = 0.1,
        participation: float = 1.0,
        average: Literal["all_clients", "sampled"] = "all_clients",
    ) -> None:
        super().__init__(num_components, participation, average)
        if num_gaussians < 1:
            raise ValueError(f"algorithm.init_args.num_gaussians must be >= 1, got {num_gaussians}")
        if embedding_dim < 1:
            raise ValueError(f"algorithm.init_args.embedding_dim must be >= 1, got {embedding_dim}")
        if not covariance_regularization > 0:
            raise ValueError(
                f"algorithm.init_args.covariance_regularization must be > 0 (it keeps every covariance "
                f"invertible), got {covariance_regularization}"
            )
        self.num_gaussians, self.embedding_dim = num_gaussians, embedding_dim
        self.covariance_regularization = covariance_regularization

    def initial_mixture(self) -> Tensor:
        m1, k = self.num_gaussians, self.num_components
        return self.models.new_full((m1, k), 1.0 / (m1 * k))

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        server.message.sends("gaussian_statistics", SUMMED)
        server.cohort.declare_every_client_work(
            "every client sends its inputs' moments once, before round 1, for the embedding's PCA"
        )
        train = server.clients.split("train")
        features = server.data.inputs(train.x[:1]).flatten(1).shape[1]
        if self.embedding_dim > features:
            raise ValueError(
                f"algorithm.init_args.embedding_dim is {self.embedding_dim}, more than the {features} "
                f"input features: give at most {features}"
            )
        pooled = self.input_statistics(train.client(0)[0])
        for c in range(1, server.num_clients):  # summed a client at a time
            pooled = pooled + self.input_statistics(train.client(c)[0])
        self.center, self.basis, variances = pca_projection(pooled, self.embedding_dim)
        draws = server.random.rng(0, "fedgmm-gaussians").standard_normal((self.num_gaussians, self.embedding_dim))
        self.means = torch.as_tensor(draws, device=variances.device) * variances.sqrt()
        self.covariances = torch.diag(variances).expand(self.num_gaussians, -1, -1).clone()
        m1, k = self.num_gaussians, self.num_components  # every client's n_t pi_t, summed: uniform weights
        self.mass = torch.full(
            (m1, k), float(server.clients.train_sizes.sum()) / (m1 * k), dtype=torch.float64, device=server.device
        )

    def flat_inputs(self, x: Tensor) -> Tensor:
        """Raw samples as the model sees them, flattened, in float64, a chunk of rows at a time."""
        parts = [
            self.server.data.inputs(x[i : i + CHUNK_ROWS]).flatten(1).to(torch.float64)
            for i in range(0, len(x), CHUNK_ROWS)
        ]
        return torch.cat(parts) if parts else x.new_zeros(0, 0, dtype=torch.float64)

    def input_statistics(self, x: Tensor) -> Tensor:
        """(1, 1 + D + D^2) a client's count, sum and sum of outer products of its inputs: what it sends for the PCA."""
        flat = self.flat_inputs(x)
        return moment_statistics(flat, flat.new_ones(len(flat), 1))

    def embed(self, x: Tensor) -> Tensor:
        """(n, embedding_dim) e(x) = (x - mean) V of raw samples, in float64."""
        return (self.flat_inputs(x) - self.center) @ self.basis

    def regularized_covariances(self) -> Tensor:
        """(M1, d, d) the Gaussians' covariances with `covariance_regularization` added to the diagonal, which keeps
        them invertible."""
        eye = torch.eye(self.embedding_dim, dtype=self.covariances.dtype, device=self.covariances.device)
        return self.covariances + self.covariance_regularization * eye

    def log_densities(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(embedding (n, d), log-densities (n, M1)) of raw samples under the Gaussians."""
        e = self.embed(x)
        return e, gaussian_log_densities(e, self.means, self.regularized_covariances())

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """E-step over the (Gaussian, model) pairs, the client's new weights ("mixture", stored by the engine) and its
        Gaussians' statistics ("gaussian_statistics", sent), then every conditional model trained with the weights
        sum_m q[m, k] (FedEM's `train_components`)."""
        train = self.server.clients.split("train")
        q, statistics = [], []
        for c in clients:
            e, densities = self.log_densities(train.client(c)[0])
            qc = joint_posterior(
                self.mixture[c].to(torch.float64).log(), densities, self.sample_losses(c).to(torch.float64)
            )
            q.append(qc)
            statistics.append(moment_statistics(e, qc.sum(dim=2)))
        trained = self.train_components(round, clients, starts, [qc.sum(dim=1).to(starts.dtype) for qc in q])
        trained.state["mixture"] = torch.stack([qc.mean(dim=0) for qc in q]).to(self.mixture.dtype)
        trained.state["gaussian_statistics"] = torch.stack(statistics)
        return trained

    def component_weights(self, group: Updates) -> Tensor:
        """(clients, K) a client's responsibility mass of each model, n_t sum_m pi_t[m, k] (the authors' weights)."""
        return group.num_samples[:, None].to(torch.float64) * group.state["mixture"].to(torch.float64).sum(dim=1)

    def round_mass(self, updates: RoundUpdates) -> Tensor:
        """(M1, K) every client's n_t pi_t summed, with the round's clients' new weights in place of their old ones."""
        clients, mixture = updates.state("mixture")
        sizes = self.server.clients.train_sizes[clients].to(torch.float64)[:, None, None]
        change = (mixture.to(torch.float64) - self.mixture.read(clients).to(torch.float64)) * sizes
        return self.mass + change.sum(dim=0)

    def total_weights(self, updates: RoundUpdates) -> Tensor:
        return self.round_mass(updates).sum(dim=0)

    def component_shares(self, mixture: Tensor) -> Tensor:
        return mixture.sum(dim=1)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """The conditional models as FedEM averages its components (by responsibility mass); then the Gaussians from
        the round's summed statistics, under `average: all_clients` with the previous Gaussians' moments weighted by
        the mass of the clients not received; a Gaussian with no mass this round keeps its value."""
        super().aggregate(round, updates)
        mass = self.round_mass(updates)
        _, statistics = updates.state("gaussian_statistics")
        summed = statistics.sum(dim=0)
        if self.average == "all_clients":
            rest = (mass.sum(dim=1) - summed[:, 0]).clamp(min=0.0)  # the mass of the clients not received
            summed = summed + rest[:, None] * self.previous_statistics()
        means, covariances = gaussians_from_statistics(summed)
        kept = summed[:, 0] > 1e-12 * float(self.server.clients.train_sizes.sum())
        self.means = torch.where(kept[:, None], means, self.means)
        self.covariances = torch.where(kept[:, None, None], covariances, self.covariances)
        self.mass = mass

    def previous_statistics(self) -> Tensor:
        """(M1, 1 + d + d^2) the current Gaussians as `moment_statistics` of unit count: (1, mu, Sigma + mu mu^T)."""
        outer = self.covariances + self.means[:, :, None] * self.means[:, None, :]
        return torch.cat([torch.ones_like(self.means[:, :1]), self.means, outer.flatten(1)], dim=1)

    def mixture_predictor(self, log_weights: Tensor) -> GaussianMixturePredictor:
        """A client's evaluation model: the conditional models weighted by p(k | x), from exp(`log_weights`) and the
        Gaussians of the embedded inputs."""
        return GaussianMixturePredictor(
            self.server.model.predict, self.models, log_weights, self.embed, self.means, self.regularized_covariances()
        )

    def newcomer_weights(self, newcomers: Newcomers) -> Tensor:
        """(newcomers, M1, K) each newcomer's weights fitted by EM with the Gaussians and models fixed (FedEM's
        `newcomer_models` then gives it the paper's rule as its model and its most used model as its cluster)."""
        losses, owner = newcomers.sample_losses(self.models)
        _, densities = self.log_densities(newcomers.split("train").x)
        fitted = fit_mixture_weights(pair_losses(losses.to(torch.float64), densities), owner, newcomers.count)
        return fitted.view(newcomers.count, self.num_gaussians, self.num_components)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "means": self.means, "covariances": self.covariances, "mass": self.mass}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.means, self.covariances, self.mass = state["means"], state["covariances"], state["mass"]
