"""FedBABU ("FedBABU: Towards Enhanced Representation for Federated Image Classification", Oh, Kim, Yun, ICLR 2022,
section 4, Algorithm 1): federated training updates and aggregates only the body; the head (the last layer) stays
at its random initial values throughout. Personalization happens at evaluation time, by fine-tuning the global
model on each client's own data.

That fine-tuning is the engine's: set `federation.finetune_epochs` (the shipped digits config sets 5, the paper's
fine-tuning epochs in its main tables). Every evaluation then reports the global model with its random head
(`<split>/acc_mean`) and, beside it, each client's fine-tuned model (`<split>_ft/acc_mean`, the paper's FedBABU
number). The fine-tuning trains the whole model (body and head) with the module's optimizer, the paper's default.

How the head is kept fixed: local training trains the body only (`server.clients.train_many(trainable=...)`, so clients
still train vectorized): the head takes no gradient and the optimizer skips it, so it never moves, weight decay
and momentum included. `aggregate` writes the initial head back into the global model, since a weighted mean of
equal heads can differ from them in the last float bit: the server's head is the initial head, bit for bit, after
every round.

Deviations:
- Bodies are averaged weighted by training-set size, as everywhere in fedlight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from fedlight.plugin import Algorithm, RoundUpdates, Trained

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class FedBABU(Algorithm):
    """FedAvg of the body with the head frozen at its initial values (trained body only, head restored after
    aggregation). Evaluate after fine-tuning with `federation.finetune_epochs`.

    Args:
        head_layers: how many layers, counted from the output, form the frozen head (> 0; default 1, the paper's
            last linear layer; a half count takes half of the boundary layer, `ServerContext.model.layer_count_mask`).
        participation: share of clients selected each round.
    """

    def __init__(self, head_layers: float = 1, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not head_layers > 0:
            raise ValueError(f"head_layers must be > 0 (FedBABU freezes a head), got {head_layers}")
        self.head_layers = head_layers

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.head = server.model.head_mask(self.head_layers, "algorithm.init_args.head_layers")
        self.initial_head = server.model.initial_params[self.head]

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The module's SGD on the body alone; the head keeps its start (the initial head) exactly."""
        return self.server.clients.train_many(
            round, clients, starts, lr_scale=self.learning_rate_scale(round), trainable=~self.head
        )

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """FedAvg, then the initial head written back (the weighted mean of equal heads may round differently)."""
        super().aggregate(round, updates)
        self.models[:, self.head] = self.initial_head
