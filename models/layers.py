"""Layer bookkeeping shared by the networks: which submodules form one "layer".

Layer personalization (FedPer, LG-FedAvg, FedTSDP) needs an ordered list of layers from input to
output. Every network exposes ``layer_names()``; this helper computes the common case so that
algorithms never need to know a network's internals (how a layer splits into halves is
`fedlight.training.layer_masks.layer_halves`).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from fedlight.training.layer_masks import owns_parameters


def default_layer_names(module: nn.Module) -> list[str]:
    """Qualified names of the submodules that own parameters directly, in registration order.

    This is the right answer for plain feed-forward networks whose layers are registered in forward
    order (conv/linear/norm leaves). Networks with blocks (ResNets) list their blocks instead.
    """
    return [name for name, m in module.named_modules() if owns_parameters(m)]


def relu_max_pool(pool: nn.MaxPool1d | nn.MaxPool2d, x: Tensor) -> Tensor:
    """`pool(relu(x))`, the papers' order, computed as `relu(pool(x))`: ReLU is monotone, so a window's largest ReLU
    is the ReLU of its largest value. Outputs and gradients are the same bit for bit (where a window has no positive
    value both orders pass no gradient), and ReLU runs on a quarter of the elements: LEAF's CNN evaluates 1.18x and
    trains 1.27x faster (batch 20) on a CPU (docs/results.md, "evaluation_scale.py")."""
    return F.relu(pool(x))
