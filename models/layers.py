"""Layer bookkeeping shared by the networks: which submodules form one "layer".

Layer personalization (FedPer, LG-FedAvg, FedTSDP) needs an ordered list of layers from input to
output. Every network exposes ``layer_names()``; these helpers compute the common cases so that
algorithms never need to know a network's internals.
"""

from __future__ import annotations

from torch import nn


def _owns_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def default_layer_names(module: nn.Module) -> list[str]:
    """Qualified names of the submodules that own parameters directly, in registration order.

    This is the right answer for plain feed-forward networks whose layers are registered in forward
    order (conv/linear/norm leaves). Networks with blocks (ResNets) list their blocks instead.
    """
    return [name for name, m in module.named_modules() if _owns_parameters(m)]


def layer_state_keys(model: nn.Module, layer: str) -> list[str]:
    """The ``state_dict`` keys (parameters and buffers) that belong to one layer of ``model``."""
    prefix = f"{layer}." if layer else ""
    return [k for k in model.state_dict() if k.startswith(prefix)]


def layer_halves(model: nn.Module, layer: str) -> tuple[list[str], list[str]]:
    """Split one layer's ``state_dict`` keys into a first and a second half (FedTSDP's half layers).

    A leaf module splits its parameters in order (``[weight, bias]`` -> weight | bias); its buffers
    (BatchNorm statistics) follow the first half, i.e. the weight. A block splits its
    parameter-owning children in order, the first ``max(1, n // 2)`` going first: a BasicBlock
    gives conv1+bn1 | conv2+bn2(+shortcut), a conv-norm block gives conv | norm.
    """
    module = model.get_submodule(layer)
    prefix = f"{layer}." if layer else ""
    if _owns_parameters(module):
        params = [n for n, _ in module.named_parameters(recurse=False)]
        k = max(1, len(params) // 2)
        second = [prefix + n for n in params[k:]]
        first = [key for key in layer_state_keys(model, layer) if key not in second]
        return first, second
    parts = [n for n, child in module.named_children() if any(True for _ in child.parameters())]
    k = max(1, len(parts) // 2)
    halves: tuple[list[str], list[str]] = ([], [])
    for i, part in enumerate(parts):
        halves[0 if i < k else 1].extend(layer_state_keys(model, prefix + part))
    return halves
