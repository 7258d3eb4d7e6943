"""FedPer (Arivazhagan et al., 2019): base layers are federated, the last layers stay with each client."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlight.plugin import Algorithm

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class FedPer(Algorithm):
    """FedAvg on the base (first) layers; every client keeps its own personalization layers (the last
    `personal_layers` of the network's layer list), trains them with the base and is evaluated with them. The
    server never averages or sends them. With `personal_layers=0` it is FedAvg.

    Args:
        personal_layers: how many layers, counted from the output, are personal; a half count (1.5) makes the
            second half of the boundary layer personal as well (`ServerContext.model.layer_count_mask`). Default 2,
            our choice for the FedPer baseline of FedTSDP ("Federated Two Stage Decoupling With Adaptive
            Personalization Layers", section 4.1.3, which gives no count; its CNN: fc1 + fc2); FedPer's paper
            varies it.
        participation: share of clients selected each round.
    """

    def __init__(self, personal_layers: float = 2, participation: float = 1.0) -> None:
        super().__init__(participation)
        if personal_layers < 0:
            raise ValueError(f"personal_layers must be >= 0, got {personal_layers}")
        self.num_personal = personal_layers

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.set_personal_mask(server.model.head_mask(self.num_personal, "algorithm.init_args.personal_layers"))
