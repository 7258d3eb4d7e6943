"""Ditto ("Ditto: Fair and Robust Federated Learning Through Personalization", Li, Hu, Beirami, Smith, ICML 2021,
section 3, Algorithm 1): a global model trained by FedAvg, and beside it one personal model v_k per client that
minimizes the client's own objective plus lambda/2 ||v_k - w||^2, w being the global model the client received in
the round. Clients are evaluated with their personal models.

A selected client, in every round t:
  1. trains the global model w^t with the module's SGD, as FedAvg does, and sends its result back;
  2. trains its personal model v_k from its previous v_k with the module's SGD on F_k(v) + lambda/2 ||v - w^t||^2
     (the proximal gradient lambda (v - w^t) added to every gradient), for `personal_epochs` epochs.
The server averages the global updates (weighted by training-set size) and stores every returned v_k (the engine
writes it: a client whose v_k is not finite is left out of the round).

Defaults and choices:
- `lam` = 1: the value of the authors' released experiments (Fashion-MNIST and Vehicle, clean and attacked); the
  paper tunes lambda per data set.
- `personal_epochs` = None: the federation's local epochs, i.e. the same local steps for v_k as for the global
  update, as in Algorithm 1 (s local iterations for both).
- Personal models start from the initial global model w^0 (Algorithm 1's input v_k^0 = w^0); a client never
  selected keeps it and is evaluated with it.

Deviations:
- Local solvers are the module's own optimizer (momentum, weight decay, schedulers as configured) rather than
  plain SGD; with the paper's plain SGD both steps are exactly Algorithm 1's.
- Both trainings of a client draw the same batch stream (purpose "train"), as the authors' code does (it takes
  one mini-batch for the personal and the global step alike), so with lam = 0 the personal models are exactly
  what Local trains.
- The global model is averaged weighted by training-set size, as everywhere in fedlight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, ClientModels, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class Ditto(Algorithm):
    """FedAvg for the global model plus one proximally regularized personal model per client (the client state
    "personal": rows for the clients trained so far), trained beside the global update (two group calls of
    `server.clients.train_many`) and sent back as `Updates.state["personal"]`, which the engine stores.

    Args:
        lam: lambda >= 0, the weight of lambda/2 ||v - w||^2 pulling each personal model towards the global one
            (0: personal models are local training alone; large: they follow the global model).
        personal_epochs: local epochs of the personal model per round (>= 1); None: the federation's local epochs.
        participation: share of clients selected each round.
    """

    def __init__(self, lam: float = 1.0, personal_epochs: int | None = None, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not lam >= 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        if personal_epochs is not None and personal_epochs < 1:
            raise ValueError(f"personal_epochs must be >= 1 (None: the local epochs), got {personal_epochs}")
        self.lam, self.personal_epochs = lam, personal_epochs

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.personal_models = server.state.declare("personal", initial=server.model.initial_params)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """Two group calls: the global update from `starts` (FedAvg's), then the personal models' update towards
        `starts` (the proximal gradient lam (v - w) added after every backward pass)."""
        trained = super().train_group(round, clients, starts)
        hook = None
        if self.lam:
            hook = lambda rows, params, grad, begin: grad.add_(params - starts[rows], alpha=self.lam)  # noqa: E731
        personal = self.server.clients.train_many(
            round,
            clients,
            self.personal_models.read(clients),
            self.personal_epochs,
            self.learning_rate_scale(round),
            hook,
        )
        trained.state = {"personal": personal.params}
        return trained

    def evaluation_models(self) -> tuple[ClientModels, Tensor]:
        """Every client is evaluated with its personal model."""
        n = self.server.num_clients
        return ClientModels(self.personal_models.__getitem__, n), torch.arange(n, device=self.server.device)
