"""FedPAC ("Personalized Federated Learning with Feature Alignment and Classifier Collaboration", Xu, Tong and Huang,
ICLR 2023, section 4 and Algorithm 1): the network is a shared feature extractor (the body, averaged as in FedAvg)
and a personal linear classifier (the head). Each round, a selected client
  1. measures, with the global body it receives, the statistics of its features that the server's classifier
     combination needs (section 4.2): the variance term V_i and, per class k, h_ik = p_i(k) mu_ik (its class prior
     times its class mean of the features);
  2. trains its head for `head_epochs` with the body frozen;
  3. trains its body for `body_epochs` with the head frozen, on cross-entropy plus the feature alignment term
     lam x mean((f(x) - c_y)^2) (section 4.1), c_y the global prototype (feature centroid) of the sample's class;
  4. sends its body, its head, its class prototypes (class means of its trained features) and the statistics of 1.
The server (a) averages the bodies (training-set-size weights, through the run's aggregator), (b) averages the
prototypes per class over the round's clients, weighted by their counts of the class, and (c) for each client i of
the round, solves the quadratic program of section 4.2 over the simplex,
    min_a  sum_j a_j^2 V_j + sum_k || sum_j a_j (h_ik - h_jk) ||^2,   a >= 0, sum_j a_j = 1,
and gives the client the head sum_j a_j head_j of the round's trained heads. Clients are evaluated with the global
body and their own (combined) head. Everything per round is the round's clients': the QP is cohort x cohort.
`fedpac/own_weight` logs the mean weight of a client's own head in its combination.
Measured (configs/digits/skew/, 2 classes per client, 60 rounds, seed 0): 0.9955 mean test accuracy (worst client
0.909); a client's own head keeps a weight of 0.82 on average in its combination.

The QP: P_i = diag(V) + D_i with D_i[j, l] = <h_i - h_j, h_i - h_l> (a Gram matrix, so P_i is positive
semi-definite), solved exactly by a primal active-set method on the simplex (`simplex_qp`, Nocedal and Wright's
Algorithm 16.3: an equality-constrained solve on the free weights, a step to the first weight that reaches 0, a
weight freed when its multiplier is negative), in float64 with a ridge of 1e-12 x the mean of diag(P_i). The authors'
code and PFLlib solve it with cvxpy; as theirs, weights at or below 1e-3 are zeroed, and the rest renormalized to
sum 1 (the authors' `agg_classifier_weighted_p` divides by their sum).

Defaults and where they come from:
- `lam` = 1.0: the authors' code (`--lam 1.0`, "1.0 for mse_loss") and PFLlib (`-lam 1.0`). The term is their
  MSELoss, the mean over the batch AND the feature dimension; the paper's ||f(x) - c_y||^2 sums over the
  dimension, so its lambda is this one divided by the feature size.
- `head_epochs` = 1: the authors' code (`epoch_classifier = 1`) and PFLlib (clientpac.py: one pass over the data).
- `body_epochs` = None, the federation's `local_epochs`: both train the body for the run's local epochs.
- The statistics are measured before training, with the received body; the prototypes after it (both as the
  authors' code); a class no client of the last round held has no global prototype, and a client's samples of it
  are aligned to the client's own class mean measured in step 1 (the authors' code; PFLlib skips them). In round 1
  there are no global prototypes, and the body trains on cross-entropy alone (both).
- Prototypes averaged weighted by class counts (the authors' `protos_aggregation`; PFLlib averages unweighted).

Deviations:
- Features for the statistics and prototypes are computed in evaluation mode (`server.model.features`); the authors'
  code runs the model in training mode (dropout, BatchNorm's batch statistics).
- Both phases use the module's optimizer and learning rate (as PFLlib), each with a fresh state; the authors' code
  trains the head at a learning rate of 0.1 whatever the body's, with momentum 0.5 and weight decay 5e-4.
- The authors' code runs one more round after the last without combining heads; fedlight's rounds all combine.
- A client that arrives after training gets the global body and the initial head, the head then trained for
  `head_epochs` on its training split with the body frozen (step 2 of a round: there is no cohort to combine with).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.plugin import PER_CLIENT, SUMMED, Algorithm, Newcomers, RoundUpdates, Trained, head_inputs

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

SMALL_WEIGHT = 1e-3  # weights at or below it are zeroed (the authors' eps)
VARIANCE, BIAS, COUNTS, PROTOTYPES = "fedpac_variance", "fedpac_bias", "fedpac_counts", "fedpac_prototypes"


# -- statistics a client sends ------------------------------------------------------------------------------------
def class_means(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """(counts (C,), means (C, d)): each class's number of samples and mean feature (zero for a class without
    samples): a client's class prototypes."""
    counts = torch.bincount(labels, minlength=num_classes).to(features.dtype)
    sums = features.new_zeros(num_classes, features.shape[1]).index_add_(0, labels, features)
    return counts, sums / counts.clamp(min=1)[:, None]


def combination_statistics(features: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """(V, h) of section 4.2 from a client's n features: h_k = p(k) mu_k ((C, d): the class prior times the class
    mean) and V = (sum_k p(k) E[||f||^2 | k] - sum_k ||h_k||^2) / n, the variance of the estimate of h from n
    samples (the authors' `statistics_extraction`); sum_k p(k) E[||f||^2 | k] is the mean of ||f||^2."""
    counts, means = class_means(features, labels, num_classes)
    n = len(labels)
    bias = (counts / n)[:, None] * means
    variance = ((features**2).sum(dim=1).mean() - (bias**2).sum()) / n
    return variance, bias


def alignment_loss(features: Tensor, labels: Tensor, targets: Tensor) -> Tensor:
    """The feature alignment term without its weight: mean over the batch and the feature dimension of
    (f(x) - c_y)^2, `targets` (C, d) holding c_k for each class k (the authors' and PFLlib's MSELoss)."""
    return ((features - targets[labels]) ** 2).mean()


# -- the server's -------------------------------------------------------------------------------------------------
def average_prototypes(counts: Tensor, means: Tensor) -> tuple[Tensor, Tensor]:
    """(prototypes (C, d), known (C,)) from m clients' class counts (m, C) and class means (m, C, d): each class's
    mean over the clients weighted by their counts of it, i.e. the mean feature of all their samples of it; a class
    no client holds is not known (its row 0)."""
    totals = counts.sum(dim=0)
    sums = (counts[:, :, None] * means).sum(dim=0)
    return sums / totals.clamp(min=1)[:, None], totals > 0


def combination_matrices(variances: Tensor, biases: Tensor) -> Tensor:
    """(m, m, m): for each client i of the round, P_i = diag(V) + D_i with D_i[j, l] = <h_i - h_j, h_i - h_l>, the
    h flattened over classes and features (`biases` (m, C x d)), so a' P_i a = sum_j a_j^2 V_j +
    sum_k ||h_ik - sum_j a_j h_jk||^2 for weights a summing to 1. From the Gram matrix G of the h, in float64:
    D_i[j, l] = G_ii - G_ij - G_il + G_jl."""
    h = biases.double().flatten(1)
    gram = h @ h.T
    own = gram.diagonal()
    bias_terms = own[:, None, None] - gram[:, :, None] - gram[:, None, :] + gram[None, :, :]
    return bias_terms + torch.diag(variances.double())[None]


def simplex_qp(P: Tensor, max_steps: int | None = None) -> Tensor:
    """The weights a minimizing a' P a over the simplex (a >= 0, sum a = 1), P (m, m) symmetric positive
    semi-definite: a primal active-set method (Nocedal and Wright, Algorithm 16.3), exact up to rounding. It starts
    at the vertex of the smallest P_jj; each step solves the problem on the free weights with their sum fixed (the
    KKT system [[2 P_FF, -1], [1', 0]] [a_F; nu] = [0; 1]), moves there or to the first free weight that reaches 0
    (fixing it), and, at a solution of the free problem, frees the fixed weight of most negative multiplier
    (2 (P a)_j - nu) until none is below -1e-9. P is scaled to a largest entry of 1 and given a ridge of 1e-10, which
    makes every free problem unique (a P of zeros, every weighting equally good: the uniform weights)."""
    m = len(P)
    scale = float(P.abs().max()) if m else 0.0
    if scale == 0.0 or not math.isfinite(scale):
        return torch.full((m,), 1.0 / max(m, 1), dtype=torch.float64, device=P.device)
    P = P.double() / scale + 1e-10 * torch.eye(m, dtype=torch.float64, device=P.device)
    tol = 1e-9
    free = torch.zeros(m, dtype=torch.bool, device=P.device)
    start = int(P.diagonal().argmin())
    free[start] = True
    a = torch.zeros(m, dtype=P.dtype, device=P.device)
    a[start] = 1.0
    for _ in range(max_steps or 10 * m + 10):
        idx = free.nonzero().flatten()
        k = len(idx)
        kkt = P.new_zeros(k + 1, k + 1)
        kkt[:k, :k] = 2 * P[idx][:, idx]
        kkt[:k, k], kkt[k, :k] = -1.0, 1.0
        rhs = P.new_zeros(k + 1)
        rhs[k] = 1.0
        solution = torch.linalg.solve(kkt, rhs)
        target, nu = a.new_zeros(m), solution[k]
        target[idx] = solution[:k]
        step = target - a
        falling = free & (step < 0)
        if bool(falling.any()):
            ratios = a[falling] / -step[falling]
            t = float(ratios.min())
            if t < 1.0:
                blocking = falling.nonzero().flatten()[int(ratios.argmin())]
                a = (a + t * step).clamp(min=0)
                a[blocking], free[blocking] = 0.0, False
                a = a / a.sum()
                continue
        a = target.clamp(min=0)
        a = a / a.sum()
        multipliers = 2 * (P @ a) - nu
        multipliers[free] = 0.0
        if bool((multipliers >= -tol).all()):
            return a
        free[int(multipliers.argmin())] = True
    raise RuntimeError(f"simplex_qp did not converge in {max_steps or 10 * m + 10} steps (P of size {m})")


def head_weights(variances: Tensor, biases: Tensor) -> Tensor:
    """(m, m): row i the weights of the round's m heads in client i's combined head, the solution of its QP, with
    weights at or below 1e-3 zeroed and the rest renormalized (the authors' code)."""
    rows = torch.stack([simplex_qp(P) for P in combination_matrices(variances.cpu(), biases.cpu())])
    kept = torch.where(rows > SMALL_WEIGHT, rows, torch.zeros_like(rows))
    sums = kept.sum(dim=1, keepdim=True)
    return torch.where(sums > 0, kept / sums.clamp(min=1e-300), rows)  # all small (over 1,000 clients): as solved


class FedPAC(Algorithm):
    """A shared body (FedAvg) aligned to global class prototypes, a personal linear head (`set_personal_mask` on the
    last layer) replaced every round by the optimal combination of the round's trained heads.

    Args:
        lam: weight of the feature alignment term (>= 0; 0: FedRep's two phases with the heads combined).
        head_epochs: local epochs of the head per round, body frozen (>= 1).
        body_epochs: local epochs of the body per round, head frozen (>= 1; None: the federation's `local_epochs`).
        participation: share of clients selected each round.
    """

    def __init__(
        self, lam: float = 1.0, head_epochs: int = 1, body_epochs: int | None = None, participation: float = 1.0
    ) -> None:
        super().__init__(participation)
        if not lam >= 0:
            raise ValueError(f"lam must be >= 0 (the weight of FedPAC's feature alignment term), got {lam}")
        if head_epochs < 1 or (body_epochs is not None and body_epochs < 1):
            raise ValueError(
                f"head_epochs and body_epochs must be >= 1 (body_epochs None: the federation's "
                f"local_epochs), got {head_epochs} and {body_epochs}"
            )
        self.lam, self.head_epochs, self.body_epochs = lam, head_epochs, body_epochs

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        for entry in (VARIANCE, BIAS):  # read client by client by the quadratic program that combines heads
            server.message.sends(entry, PER_CLIENT)
        for entry in (COUNTS, PROTOTYPES):  # summed into the global prototypes
            server.message.sends(entry, SUMMED)
        self.head = server.model.layer_count_mask(1, "last")
        layer = server.model.head
        if not isinstance(layer, nn.Linear) or int(self.head.sum()) != sum(p.numel() for p in layer.parameters()):
            raise ValueError(
                f"FedPAC combines linear heads on the features: the network's last layer must be one "
                f"nn.Linear, not {type(layer).__name__}: set model.network to a network that ends with "
                "nn.Linear"
            )
        self.num_classes, features = layer.out_features, layer.in_features
        self.prototypes = server.model.initial_params.new_zeros(self.num_classes, features)
        self.known = torch.zeros(self.num_classes, dtype=torch.bool, device=server.device)
        self.set_personal_mask(self.head)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Statistics with the received body, the head phase (batch stream "head", body frozen), the body phase
        (stream "train", head frozen, aligned to the global prototypes once there are any), then the prototypes;
        the statistics and prototypes are sent beside the models (`Trained.state`)."""
        scale = self.learning_rate_scale(round)
        split = self.server.clients.split("train")
        received = [self._features(start, *split.client(c)) for c, start in zip(clients, starts)]
        variances, biases, own_means = [], [], []
        for features, labels in received:
            variance, bias = combination_statistics(features, labels, self.num_classes)
            variances.append(variance)
            biases.append(bias)
            own_means.append(class_means(features, labels, self.num_classes)[1])
        tuned = self.server.clients.train_many(
            round, clients, starts, self.head_epochs, scale, trainable=self.head, purpose="head"
        )
        alignment: dict[str, Any] = {}
        if self.lam > 0 and bool(self.known.any()):  # round 1 has no global prototypes: cross-entropy alone
            targets = torch.stack([torch.where(self.known[:, None], self.prototypes, own) for own in own_means])
            alignment = {"objective": self._objective, "client_inputs": targets}
        trained = self.server.clients.train_many(
            round, clients, tuned.params, self.body_epochs, scale, trainable=~self.head, **alignment
        )
        counts, means = zip(
            *(
                class_means(*self._features(params, *split.client(c)), self.num_classes)
                for c, params in zip(clients, trained.params)
            )
        )
        trained.state.update(
            {
                VARIANCE: torch.stack(variances)[:, None],
                BIAS: torch.stack(biases),
                COUNTS: torch.stack(counts),
                PROTOTYPES: torch.stack(means),
            }
        )
        return trained

    def _features(self, params: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(features of a client's samples under `params`, their labels)."""
        return self.server.model.features(params, x)[0], y.to(params.device)

    def _objective(self, module: nn.Module, batch: tuple[Tensor, Tensor], targets: Tensor) -> Tensor:
        x, y = batch
        features, outputs = head_inputs(module, self.server.model.head, x)
        return F.cross_entropy(outputs, y) + self.lam * alignment_loss(features, y, targets)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """FedAvg of the bodies (the inherited aggregate, which also stores the trained heads), then the global
        prototypes from the round's clients and each client's head combined from the round's heads."""
        super().aggregate(round, updates)
        if VARIANCE not in updates.state_names():
            return  # every client was left out
        clients, variances = updates.state(VARIANCE)
        biases, counts, means = (updates.state(name)[1] for name in (BIAS, COUNTS, PROTOTYPES))
        self.prototypes, self.known = average_prototypes(counts, means)
        weights = head_weights(variances[:, 0], biases)
        assert self.personal is not None  # the heads are personal
        heads = self.personal.read(clients.tolist())
        self.personal.write(clients, weights.to(heads) @ heads)
        self.log("fedpac/own_weight", float(weights.diagonal().mean()))

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, None]:
        """Each newcomer's model: the global body with the initial head, the head trained `head_epochs` on the
        newcomer's training split with the body frozen. (count, d) models, one a newcomer."""
        models, groups, _ = super().newcomer_models(newcomers)
        assert isinstance(models, Tensor)  # the base class's: one matrix of models
        fitted = newcomers.train_many(
            list(range(newcomers.count)), models[groups], self.head_epochs, purpose="head", trainable=self.head
        )
        return fitted, torch.arange(newcomers.count, device=fitted.device), None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "prototypes": self.prototypes, "known": self.known}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.prototypes, self.known = state["prototypes"], state["known"]
