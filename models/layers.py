"""Layer bookkeeping shared by the networks: which submodules form one "layer".

Layer personalization (FedPer, LG-FedAvg, FedTSDP) needs an ordered list of layers from input to
output. Every network exposes ``layer_names()``; this helper computes the common case so that
algorithms never need to know a network's internals (how a layer splits into halves is
`fedlight.training.layer_masks.layer_halves`).
"""

from __future__ import annotations

from torch import nn

from fedlight.training.layer_masks import owns_parameters


def default_layer_names(module: nn.Module) -> list[str]:
    """Qualified names of the submodules that own parameters directly, in registration order.

    This is the right answer for plain feed-forward networks whose layers are registered in forward
    order (conv/linear/norm leaves). Networks with blocks (ResNets) list their blocks instead.
    """
    return [name for name, m in module.named_modules() if owns_parameters(m)]
