"""Personal heads evaluated at scale: when every client's model is its cluster's model with only head entries of its
own (FedPer, FedRep: `Algorithm.personal_mask` inside the network's last layer), the clients of a cluster share the
whole body. The evaluator then runs each cluster's body once over all its clients' rows, in large batches, and each
client's head alone on its rows' features, instead of loading and running a full model per client: at 3,400
writers with LEAF's CNN a full model a client copies 6.6 M entries 3,400 times and runs 3,400 batches of a few
dozen images. Each client's outputs are those of its own model (up to float rounding), so its metrics are its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from fedlight.plugin.aggregation import ClientModels


class SharedBodyModels(ClientModels[Tensor]):
    """Every client's own model (indexing builds it whole, as `ClientModels` does), with the structure the
    evaluator reads to share the body: `bodies` (K, d) the cluster models, `group` (n,) each client's cluster, and
    `personal_index` (p,) the flat positions of the personal entries, all inside the head, whose values for a
    client `personal_row(client)` gives."""

    def __init__(
        self,
        model_of: Callable[[int], Tensor],
        num_clients: int,
        bodies: Tensor,
        group: Tensor,
        personal_index: Tensor,
        personal_row: Callable[[int], Tensor],
    ) -> None:
        super().__init__(model_of, num_clients)
        self.bodies, self.group, self.personal_index, self.personal_row = bodies, group, personal_index, personal_row


def personal_heads(personal_mask: Tensor, head_mask: Tensor) -> bool:
    """Whether every personal entry lies in the head, so that clients of a cluster share the rest."""
    return not bool((personal_mask & ~head_mask).any())


def client_spans(client_of_row: Tensor) -> dict[int, Tensor]:
    """Each client's positions in `client_of_row` (one index tensor a client that has rows)."""
    order = torch.argsort(client_of_row, stable=True)
    clients, counts = torch.unique_consecutive(client_of_row[order], return_counts=True)
    return dict(zip(clients.tolist(), torch.split(order, counts.tolist())))
