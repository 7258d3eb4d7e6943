"""MOON (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021), section 3 (the local objective, eq. 3-4,
Algorithm 1).

Each client trains the global model w^t on its data with cross-entropy plus a model-contrastive term that pulls its
representation z of a sample towards the global model's z_glob and away from that of its own previous local model
z_prev:

    l_con = -log( exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) ),
    loss  = cross-entropy + mu * mean over the batch of l_con,

sim being the cosine similarity; z_glob and z_prev are constants (the two models are frozen). The server averages
the trained models as FedAvg does.

How it maps onto fedlight:
- the representation is the network's features, the input of its head (`fedlight.plugin.model_parts`), as PFLlib's
  MOON reads it (its `model.base(x)`); the paper adds a projection head, part of its network, which a network here
  may include before its last layer;
- every client of a round trains vectorized on one objective (`train_many`): the global model runs through
  `functional_call` with the round's weights, the previous model with the client's own row of `client_inputs`;
- a client's previous local model is a client-state store (`moon_previous`, spilled to disk past the memory budget at
  cross-device scale), written by the engine from the model the client returns after the round; a client that has not
  trained yet holds the initial model (the authors' code keeps a copy of the initial network per party).

Defaults: tau = 0.5 (the paper's), mu = 1 (its value for CIFAR-100 and Tiny-ImageNet; 5 for CIFAR-10).

Deviations: the frozen global and previous models run in training mode, as the client's own model does (the
authors' code leaves them so): BatchNorm normalizes by the batch, the statistics it moves are copies, thrown away.
Round 1's previous model equals the global one for every client, so its contrastive term is the constant log 2 and
its gradient zero: MOON's first round is FedAvg's.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.plugin import Algorithm, Trained, features_with, head_inputs

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

PREVIOUS = "moon_previous"


def model_contrastive_loss(z: Tensor, z_global: Tensor, z_previous: Tensor, temperature: float) -> Tensor:
    """Mean over the rows of -log(e^{s_g / tau} / (e^{s_g / tau} + e^{s_p / tau})), s the cosine similarities of z to
    z_global and to z_previous: logsumexp(s_g, s_p) / tau - s_g / tau, stable for any tau."""
    positive = F.cosine_similarity(z, z_global, dim=-1) / temperature
    negative = F.cosine_similarity(z, z_previous, dim=-1) / temperature
    return (torch.stack([positive, negative], dim=-1).logsumexp(dim=-1) - positive).mean()


class MOON(Algorithm):
    """FedAvg with a model-contrastive term in the local objective (see the module docstring).

    Args:
        mu: weight of the contrastive term (>= 0; 0 is FedAvg).
        temperature: tau of the similarities (> 0).
        participation: share of clients selected each round.
    """

    def __init__(self, mu: float = 1.0, temperature: float = 0.5, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not mu >= 0:
            raise ValueError(f"MOON's mu must be >= 0, got {mu}: it weighs the contrastive term (0 leaves it out)")
        if not temperature > 0:
            raise ValueError(f"MOON's temperature must be > 0, got {temperature}")
        self.mu, self.temperature = mu, temperature

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.head = server.model.head  # a model without a layer is refused here, in one line, not in round 1
        self.previous = server.state.declare(PREVIOUS, initial=server.model.initial_params.clone())

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Cross-entropy + mu x the contrastive term on every client of the group at once; each client's trained
        model is returned as its next previous model."""
        if self.mu == 0:
            trained = super().train_group(round, clients, starts)
        else:
            server = self.server
            global_weights = server.model.named_tensors(self.models[0].clone())
            objective = functools.partial(self._objective, global_weights)
            trained = server.clients.train_many(
                round,
                clients,
                starts,
                lr_scale=self.learning_rate_scale(round),
                objective=objective,
                client_inputs=self.previous.read(clients),
            )
            server.clients.forward_passes(clients, 2)  # the frozen global and previous models, on every batch
        return Trained(trained.params, trained.loss, trained.logs, {**trained.state, PREVIOUS: trained.params.clone()})

    def _objective(
        self, global_weights: dict[str, Tensor], module: nn.Module, batch: tuple[Tensor, Tensor], previous: Tensor
    ) -> Tensor:
        x, y = batch
        head = self.head
        z, logits = head_inputs(module, head, x)
        z_global = features_with(module, head, global_weights, x).detach()
        z_previous = features_with(module, head, self.server.model.named_tensors(previous), x).detach()
        return F.cross_entropy(logits, y) + self.mu * model_contrastive_loss(z, z_global, z_previous, self.temperature)
