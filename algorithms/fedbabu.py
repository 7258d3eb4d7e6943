"""FedBABU ("FedBABU: Towards Enhanced Representation for Federated Image Classification", Oh, Kim, Yun, ICLR 2022,
section 4, Algorithm 1): federated training updates and aggregates only the body; the head (the last layer) stays
at its random initial values throughout. Personalization happens at evaluation time, by fine-tuning the global
model on each client's own data.

That fine-tuning is the engine's: set `federation.finetune_epochs` (the shipped digits config sets 5, the paper's
fine-tuning epochs in its main tables). Every evaluation then reports the global model with its random head
(`<split>/acc_mean`) and, beside it, each client's fine-tuned model (`<split>_ft/acc_mean`, the paper's FedBABU
number). The fine-tuning trains the whole model (body and head) with the module's optimizer, the paper's default.

How the head is kept fixed: every client's head gradient is zeroed after each backward pass (a gradient hook,
so clients still train vectorized); with plain SGD or momentum it then never moves, since the optimizer's state
starts afresh for each client. Weight decay would still shrink it, so `aggregate` writes the initial head back
into the global model: the server's head is the initial head, bit for bit, after every round.

Deviations:
- With weight decay in the optimizer a client's head shrinks a little within its local training (the decay acts
  on every parameter the optimizer holds), which the forward passes of that training see; the server's head is
  unaffected.
- Bodies are averaged weighted by training-set size, as everywhere in fedlight.
"""
from __future__ import annotations

from torch import Tensor

from fedlight.plugin import Algorithm, RoundUpdates


class FedBABU(Algorithm):
    """FedAvg of the body with the head frozen at its initial values (zeroed head gradient, head restored after
    aggregation). Evaluate after fine-tuning with `federation.finetune_epochs`.

    Args:
        head_layers: how many layers, counted from the output, form the frozen head (> 0; default 1, the paper's
            last linear layer; a half count takes half of the boundary layer, `ServerContext.layer_count_mask`).
        participation: share of clients selected each round.
    """

    corrects_gradient = True  # the head's gradient is zeroed

    def __init__(self, head_layers: float = 1, participation: float = 1.0) -> None:
        super().__init__(participation)
        if not head_layers > 0:
            raise ValueError(f"head_layers must be > 0 (FedBABU freezes a head), got {head_layers}")
        self.head_layers = head_layers

    def setup(self, server) -> None:
        super().setup(server)
        self.head = server.layer_count_mask(self.head_layers, "last")
        self.initial_head = server.initial_params[self.head]

    def local_gradient(self, client: int, params: Tensor, grad: Tensor, start: Tensor) -> None:
        grad.masked_fill_(self.head, 0)

    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        """FedAvg, then the initial head written back (weight decay may have moved the clients' heads)."""
        super().aggregate(round, updates)
        self.models[:, self.head] = self.initial_head
