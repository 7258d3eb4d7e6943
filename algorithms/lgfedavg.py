"""LG-FedAvg (Liang et al., 2020, "Think locally, act globally"): each client keeps its first layers (a local
representation); only the last layers are global and averaged."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedlight.plugin import Algorithm

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class LGFedAvg(Algorithm):
    """The mirror image of FedPer: the first layers are local, the last `global_layers` layers of the network's
    layer list are FedAvg-averaged over the clients. Each client is evaluated with its own local layers and
    the global ones.

    Global layers are averaged weighted by training-set size, as everywhere in fedlight (the reference code
    takes the plain mean over the round's clients). The paper's warm start from a FedAvg-trained model is not
    part of this class: run FedAvg first and start from its weights if wanted.

    Args:
        global_layers: how many layers, counted from the output, are global; a half count shares the second
            half of the boundary layer too. Default 2 is our choice (the reference code's MNIST run keeps the
            last 3 of its 5-layer MLP global, `--num_layers_keep 3`).
        participation: share of clients selected each round.
    """

    def __init__(self, global_layers: float = 2, participation: float = 1.0) -> None:
        super().__init__(participation)
        if global_layers < 0:
            raise ValueError(f"global_layers must be >= 0, got {global_layers}")
        self.global_layers = global_layers

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        total = len(server.model.layers())
        if self.global_layers > total:
            raise ValueError(f"global_layers={self.global_layers} exceeds the model's {total} layers")
        self.set_personal_mask(~server.model.head_mask(self.global_layers, "algorithm.init_args.global_layers"))
