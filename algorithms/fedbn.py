"""FedBN (Li, Jiang, Zhang, Kamp, Dou, 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization"): FedAvg on everything but the BatchNorm layers, which every client keeps for itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.nn.modules.batchnorm import _BatchNorm

from fedlight.plugin import Algorithm

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class FedBN(Algorithm):
    """Each client keeps its BatchNorm layers (scale, shift and running statistics), trains them with the rest of
    the network and is evaluated with them; the server averages only the other layers. Without BatchNorm in the
    network it is FedAvg.

    Args:
        participation: share of clients selected each round.
    """

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.set_personal_mask(server.model.module_mask((_BatchNorm,)))
