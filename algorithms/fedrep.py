"""FedRep ("Exploiting Shared Representations for Personalized Federated Learning", Collins, Hassani, Mokhtari,
Shakkottai, ICML 2021, section 3, Algorithm 1): the network is a shared representation (the body) followed by a
personal head. A selected client starts from the global body and its own head, and
  1. trains its head for `head_epochs` with the body frozen,
  2. then trains the body for `body_epochs` with its new head frozen.
The server averages the bodies (FedAvg, weighted by training-set size); every client keeps its head, which the
server never averages. Clients are evaluated with the global body and their own head.

A client that arrives after training (a newcomer, `newcomer_models`) gets what a client's first head phase gives it:
the global body with the initial model's head, the head then trained for `head_epochs` on the newcomer's training
split with the body frozen (the module's SGD, batch stream "head", the newcomers in one `train_many` group), and it
is evaluated with that fitted head: the paper's representation is learned for new clients to fit only a head on it.
The engine's `federation.finetune_epochs` is not this: it fine-tunes the whole model (body included) for its own
epochs, so it is left to report `unseen_ft/*` beside, from the fitted model.

Defaults (the paper's, section 5): `head_layers` = 1 (the last layer of the network's layer list: the paper's
linear head), `head_epochs` = 10 and `body_epochs` = 1. Ten head epochs also suit the small digits clients: a
linear head on about 60 images is some 40 steps at batch 16, cheap next to the shared body's one epoch.

Freezing a part: its parameter tensors take no gradient and the optimizer skips them (`server.clients.train_many`'s
`trainable`), so neither SGD, momentum nor weight decay moves it within a phase, and the frozen part, buffers
included (BatchNorm statistics the forward passes update), is restored to its value at the start of the phase
afterwards.

Deviations:
- Local solvers are the module's own optimizer (momentum, weight decay, schedulers as configured); its state starts
  afresh for each phase.
- `federation.local_epochs` is not used for training: the two phases have their own epoch counts.
- Heads start from the initial model's head for every client; a client never selected keeps it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from fedlight.plugin import Algorithm, Newcomers, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class FedRep(Algorithm):
    """Shared body (FedAvg), personal head (`set_personal_mask`), head-then-body local training, each phase one
    group call of `server.clients.train_many` with the other part frozen.

    Args:
        head_layers: how many layers, counted from the output, form the personal head (> 0; a half count takes
            half of the boundary layer, `ServerContext.model.layer_count_mask`).
        head_epochs: local epochs of the head per round, body frozen (>= 1).
        body_epochs: local epochs of the body per round, head frozen (>= 1).
        participation: share of clients selected each round.
    """

    def __init__(
        self, head_layers: float = 1, head_epochs: int = 10, body_epochs: int = 1, participation: float = 1.0
    ) -> None:
        super().__init__(participation)
        if not head_layers > 0:
            raise ValueError(f"head_layers must be > 0 (FedRep needs a personal head), got {head_layers}")
        if head_epochs < 1 or body_epochs < 1:
            raise ValueError(f"head_epochs and body_epochs must be >= 1, got {head_epochs} and {body_epochs}")
        self.head_layers, self.head_epochs, self.body_epochs = head_layers, head_epochs, body_epochs

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.head = server.model.head_mask(self.head_layers, "algorithm.init_args.head_layers")
        self.set_personal_mask(self.head)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The head phase (batch stream "head", body frozen), then the body phase (the ordinary stream "train", head
        frozen); the frozen part of each phase equals its start exactly."""
        scale = self.learning_rate_scale(round)
        tuned = self.server.clients.train_many(
            round, clients, starts, self.head_epochs, scale, trainable=self.head, purpose="head"
        )
        return self.server.clients.train_many(
            round, clients, tuned.params, self.body_epochs, scale, trainable=~self.head
        )

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, None]:
        """Each newcomer's model: the global body with the initial head (the base class's fresh personal part),
        the head trained `head_epochs` on the newcomer's training split with the body frozen, which ends exactly
        at the global body. (count, d) models, one a newcomer."""
        models, groups, _ = super().newcomer_models(newcomers)
        assert isinstance(models, Tensor)  # the base class's: one matrix of models
        fitted = newcomers.train_many(
            list(range(newcomers.count)), models[groups], self.head_epochs, purpose="head", trainable=self.head
        )
        return fitted, torch.arange(newcomers.count, device=fitted.device), None
