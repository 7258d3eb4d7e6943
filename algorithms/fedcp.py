"""FedCP ("FedCP: Separating Feature Information for Personalized Federated Learning via Conditional Policy", Zhang,
Hua, Wang, Song, Xue, Ma, Guan; KDD 2023), section 4: a Conditional Policy Network (CPN) splits each sample's features
h into a personalized part h * r, read by the client's own head, and a global part h * s, read by a frozen copy of the
global head (r + s = 1 element-wise); an MMD term keeps the client's features close to the global body's.

As the authors' code runs it (PFLlib's `clientcp.py` and `servercp.py`, which every detail below follows; the paper's
text was not at hand to check them against):

    v = sum over classes of the personal head's weight rows, normalized to length 1 (fixed for the round),
    (r, s) = softmax over each pair of Gumbel-perturbed scores, CPN(h * v) = ReLU(LayerNorm(Linear(h * v))) read as
             two score vectors of h's size (the first r's, the second s's), temperature 1, soft,
    logits = personal_head(h * r) + global_head(h * s),
    loss   = cross-entropy(logits, y) + lam * MMD(h, h_global),

h_global being the features of the global body the round started from (frozen) on the same batch; MMD is the biased
estimate under the sum of four Gaussian kernels, exp(-d^2 / (2a)) for a in (10, 15, 20, 50) (`mmd`). One optimizer
(PFLlib's `self.opt` over the whole ensemble, at the one learning rate: nothing to fold into the gradient's scale)
trains the body, the personal head and the CPN; the global head is frozen. Each client then sends its body, its CPN
and, as its global head, the mean of its personal head and the global head it received; the server averages the
three (weighted by training-set size). The personal head stays with the client.

How it sits on the engine: the network's own head (its last layer) is the personal head, kept personal by mask; the
CPN and the global head (a copy of the network's head, from its initial weights) are modules the method adds
(`extend_model`), averaged with the body. The round's clients train vectorized on one objective (`train_many`, the
global head frozen by `trainable`): each client's context is its row of `client_inputs`, and the frozen global body
runs through `torch.func.functional_call` with the round's global weights (`server.model.named_tensors`), on copies of
the client's buffers. A forward hook on the head replaces its output with the two-head logits, so evaluation,
fine-tuning and newcomers see the FedCP model. Every number lives in the flat models (shared or personal), so a
resumed run is exact; the work grows with the round's clients only.

Defaults: lam = 1.0 is PFLlib's `-lam` default (the authors' FedCP repository runs MNIST with 5); the CPN's width
(twice the features), the kernels, the temperature 1 and the 0.5 upload mix are fixed in the authors' code.

Deviations from PFLlib, and why:
- The policy is the softmax without Gumbel noise in evaluation (PFLlib draws noise at test time too, so its
  accuracy is that of one random draw); training draws the noise, as PFLlib does. Evaluation is then a function of
  the models alone (deterministic, exactly resumed).
- A client's context comes from its personal head from the start: PFLlib draws a uniform random context for a
  client's first round (before its personal head has trained once), which carries nothing of the client.
- Under partial participation every client reads the current averaged global head and CPN; PFLlib sends them to the
  round's clients only (the body to every client), so a client left out keeps stale copies. At PFLlib's join ratio
  1 the two are the same.
- The module's optimizer is used as configured (PFLlib's is plain SGD: configure momentum 0 to match); its state
  starts afresh each round, as fedlight's local training always does.
- The frozen global body runs in training mode, as PFLlib's copy does (dropout, BatchNorm's batch statistics); the
  BatchNorm statistics it moves are copies of the client's, thrown away.
- The head must be one linear layer (PFLlib also takes a stack of linear layers, the context then being the sum of
  their weights' product).
- A newcomer (a held-out client) gets the averaged model with the global head as its personal head: it predicts with
  the global head on the global body's features (the two shares sum to one; the bias counts twice);
  `federation.finetune_epochs` then personalizes it (the module's `training_step` on the FedCP model).
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.plugin import Algorithm, ModelParts, Newcomers, Trained, features_with, head_inputs

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

POLICY = "fedcp_policy"
GLOBAL_HEAD = "fedcp_global_head"
#: the squared-distance scales of the MMD's four Gaussian kernels, exp(-d^2 / (2a)) (PFLlib's `MMD(..., 'rbf')`)
KERNEL_SCALES = (10.0, 15.0, 20.0, 50.0)


def mmd(x: Tensor, y: Tensor) -> Tensor:
    """The biased MMD estimate between the rows of x and y (n rows each) under the sum of the Gaussian kernels of
    `KERNEL_SCALES`: mean(K(x, x) + K(y, y) - 2 K(x, y)) over every pair, squared distances by the expansion
    |a|^2 + |b|^2 - 2 a.b as the authors compute them."""
    xx, yy, xy = x @ x.T, y @ y.T, x @ y.T
    rx, ry = xx.diagonal(), yy.diagonal()
    distances = (rx[:, None] + rx[None] - 2 * xx, ry[:, None] + ry[None] - 2 * yy, rx[:, None] + ry[None] - 2 * xy)
    kxx, kyy, kxy = (gaussian_kernels(d) for d in distances)
    return (kxx + kyy - 2 * kxy).mean()


def gaussian_kernels(squared_distances: Tensor) -> Tensor:
    """The sum of the Gaussian kernels of `KERNEL_SCALES` at the given squared distances."""
    kernels = [torch.exp(-0.5 * squared_distances / a) for a in KERNEL_SCALES]
    return sum(kernels[1:], kernels[0])


def policy_network(features: int) -> nn.Module:
    """The CPN: Linear(features, 2 features), LayerNorm, ReLU (PFLlib's `ConditionalSelection(in_dim, in_dim)`)."""
    return nn.Sequential(nn.Linear(features, 2 * features), nn.LayerNorm(2 * features), nn.ReLU())


def context_of(head_weight: Tensor) -> Tensor:
    """A client's context from its personal head's (classes, features) weight ((..., classes, features) for rows of
    clients): the sum over classes, normalized to length 1, detached."""
    return F.normalize(head_weight.detach().sum(-2), dim=-1)


def gumbel_noise(like: Tensor) -> Tensor:
    """Standard Gumbel noise of `like`'s shape, drawn as `F.gumbel_softmax` draws it (the default generator)."""
    return -torch.empty_like(like).exponential_().log()


def policy_shares(policy: nn.Module, features: Tensor, context: Tensor, noisy: bool) -> tuple[Tensor, Tensor]:
    """(r, s): each feature's personal and global share, r + s = 1, from the CPN's scores of the features times the
    context; the soft Gumbel-softmax at temperature 1 over each (personal, global) pair when `noisy`, else the
    softmax."""
    scores = policy(features * context).unflatten(-1, (2, features.shape[-1]))
    if noisy:
        scores = scores + gumbel_noise(scores)
    shares = scores.softmax(dim=-2)
    return shares[..., 0, :], shares[..., 1, :]


class FedCP(Algorithm):
    """Per-sample feature separation by a conditional policy between a personal head and a frozen global head, with
    the features aligned to the global body's by MMD; body, policy network and global head averaged.

    Args:
        lam: weight of the MMD between the client's features and the global body's (>= 0; 0 leaves it out).
        participation: share of clients selected each round.
    """

    def __init__(self, lam: float = 1.0, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not lam >= 0:
            raise ValueError(f"FedCP's lam (the MMD weight) must be >= 0, got {lam}: give 0 to leave the MMD out")
        self.lam = lam
        self._context: Tensor | None = None  # the clients' contexts while their objective runs
        self._plain_head = False  # the global body's forward pass: the head's output as the network computes it

    def extend_model(self, parts: ModelParts) -> None:
        size = parts.feature_size("FedCP")
        if size < 1:
            raise ValueError(
                f"FedCP's policy network splits the head's {size} input features: end the network with "
                "an nn.Linear that reads at least one feature"
            )
        assert parts.head_name is not None  # `feature_size` read the head
        self.head_layer = parts.head_name
        parts.add(GLOBAL_HEAD, copy.deepcopy(parts.head))  # PFLlib: the global head starts as a copy of the head
        parts.add(POLICY, policy_network(size))
        parts.head.register_forward_hook(self._two_head_logits)

    def _two_head_logits(self, head: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
        """The head's output replaced by personal_head(h * r) + global_head(h * s)."""
        if self._plain_head:
            return output
        features, linear = args[0], cast(nn.Linear, head)  # `setup` checked that the head is one linear layer
        module = self.server.model.module
        policy = module.get_submodule(POLICY)
        context = context_of(linear.weight) if self._context is None else self._context
        personal, shared = policy_shares(policy, features, context, noisy=policy.training)
        return F.linear(features * personal, linear.weight, linear.bias) + module.get_submodule(GLOBAL_HEAD)(
            features * shared
        )

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.personal_head = server.model.layer_mask([self.head_layer])
        self.global_head = server.model.layer_mask([GLOBAL_HEAD])
        if int(self.personal_head.sum()) != int(self.global_head.sum()):
            raise ValueError(
                "FedCP's global head copies the network's last layer, which must be the linear head "
                "alone; end the network with one nn.Linear"
            )
        self.set_personal_mask(self.personal_head)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The round's clients on cross-entropy of the two-head logits + lam x MMD, the global head frozen; each
        sends the mean of its personal head and the received global head as its global head."""
        server = self.server
        contexts = context_of(server.model.named_tensors(starts)[f"{self.head_layer}.weight"])
        global_model = server.model.named_tensors(self.models[0].clone())
        weights = {
            name: global_model[name] for name, _ in server.model.module.named_parameters() if name in global_model
        }  # a frozen base is outside the flat model: the module's own stands in
        objective = functools.partial(self._objective, weights)
        trained = server.clients.train_many(
            round,
            clients,
            starts,
            lr_scale=self.learning_rate_scale(round),
            trainable=~self.global_head,
            objective=objective,
            client_inputs=contexts,
        )
        if self.lam:
            server.clients.forward_passes(clients, 1)  # the frozen global body, on every batch
        params = trained.params
        params[:, self.global_head] = 0.5 * (params[:, self.personal_head] + params[:, self.global_head])
        return trained

    def _objective(
        self, global_weights: dict[str, Tensor], module: nn.Module, batch: tuple[Tensor, Tensor], context: Tensor
    ) -> Tensor:
        """Cross-entropy of the two-head logits + lam x MMD between the client's features and those of the global
        body (`global_weights`, the parameters; the client's buffers, copied) on the same batch."""
        x, y = batch
        self._context = context
        try:
            features, logits = head_inputs(module, self.server.model.head, x)
        finally:
            self._context = None
        loss = F.cross_entropy(logits, y)
        if self.lam == 0:
            return loss
        self._plain_head = True
        try:
            global_features = features_with(
                module, self.server.model.head, {**global_weights, **dict(module.named_buffers())}, x
            )
        finally:
            self._plain_head = False
        return loss + self.lam * mmd(features, global_features.detach())

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, None]:
        """The averaged model with the global head as the personal head."""
        model = self.models[:1].clone()
        model[:, self.personal_head] = model[:, self.global_head]
        return model, torch.zeros(newcomers.count, dtype=torch.long, device=model.device), None
