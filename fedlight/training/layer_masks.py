"""Which parts of a model are shared and which stay with each client, counted in layers.

Personalized algorithms name their personal part by position in the network's ordered layer list
(`FlatModel.layers()`, from the network's `layer_names()`): the last k layers (FedPer's head), the first k
layers (LG-FedAvg's local representation), or a count that ends in .5 (FedTSDP's shared-layer schedule). A
half layer is the boundary layer's declared first or second half (`layer_halves`: a
`[weight, bias]` layer splits into weight | bias, a ResNet BasicBlock into conv1+bn1 | conv2+bn2+shortcut;
BatchNorm statistics go with their module's weight).

The functions here return boolean masks over the flat vector; `Algorithm.set_personal_mask` installs one.
Nothing here knows any algorithm.
"""

from __future__ import annotations

import math
from typing import Callable, Literal

from torch import Tensor, nn

from fedlight.training.flat import FlatModel

Side = Literal["first", "last"]
Halves = Callable[[str], "tuple[list[str], list[str]]"]
_TOLERANCE = 1e-9  # 4 * 0.98**k is not exact in binary; a count within this of a half step is that step


def first_layers(layers: list[str], count: int) -> list[str]:
    """The first `count` layer names (input side)."""
    return layers[: _whole(count, len(layers))]


def last_layers(layers: list[str], count: int) -> list[str]:
    """The last `count` layer names (output side); `count=0` gives none."""
    return layers[len(layers) - _whole(count, len(layers)) :]


def half_step(value: float, rounding: Literal["floor", "round"] = "floor") -> float:
    """A real layer count on the half-layer grid: `floor(2v)/2` (3.92 -> 3.5) or `round(2v)/2` (3.92 -> 4.0).

    Values within 1e-9 of a grid point count as that point, so 4 * 0.98**k landing a rounding error below 3.5
    still gives 3.5. Halves are rounded up under "round" (3.75 -> 4.0), not to even.
    """
    if rounding == "floor":
        return math.floor(2 * value + _TOLERANCE) / 2
    if rounding == "round":
        return math.floor(2 * value + 0.5 + _TOLERANCE) / 2
    raise ValueError(f"rounding must be 'floor' or 'round', got {rounding!r}")


def layer_count_mask(flat: FlatModel, count: float, side: Side = "first", halves: Halves | None = None) -> Tensor:
    """True on the tensors of the first (or last) `count` layers of `flat.layers()`.

    `count` is a whole or half number in [0, number of layers]. A half count takes, of the boundary layer, the
    half next to the counted block: the first half when counting from the input, the second when counting from
    the output. So `layer_count_mask(flat, c, "first")` and `layer_count_mask(flat, L - c, "last")` are exact
    complements. `halves(layer) -> (first-half names, second-half names)` splits a layer (default:
    `layer_halves` on the flat model's module); tensors of the boundary layer in neither
    list go with the first half.
    """
    layers = flat.layers()
    if side not in ("first", "last"):
        raise ValueError(f"side must be 'first' or 'last', got {side!r}")
    doubled = 2 * count
    if not (0 <= count <= len(layers)) or abs(doubled - round(doubled)) > _TOLERANCE:
        raise ValueError(
            f"count must be a whole or half number in [0, {len(layers)}] (the model's layers are "
            f"{layers}), got {count}; put a real count on the grid with half_step()"
        )
    whole, half = divmod(int(round(doubled)), 2)
    chosen = set(first_layers(layers, whole) if side == "first" else last_layers(layers, whole))
    in_half: set[str] = set()
    if half:
        boundary = layers[whole] if side == "first" else layers[len(layers) - whole - 1]
        first, second = (halves or _module_halves(flat))(boundary)
        if side == "first":
            in_half = {e.name for e in flat.entries if e.layer == boundary and e.name not in set(second)}
        else:
            in_half = {e.name for e in flat.entries if e.layer == boundary and e.name in set(second)}
    return flat.mask(lambda e: e.layer in chosen or e.name in in_half)


def tensor_names(flat: FlatModel, mask: Tensor) -> list[str]:
    """Names of the flat model's tensors that lie entirely inside `mask` (for logs and tests)."""
    return [e.name for e in flat.entries if bool(mask[e.start : e.stop].all())]


def _whole(count: int, total: int) -> int:
    if int(count) != count or not 0 <= count <= total:
        raise ValueError(f"a layer count must be a whole number in [0, {total}], got {count}")
    return int(count)


def _module_halves(flat: FlatModel) -> Halves:
    return lambda layer: layer_halves(flat.module, layer)


def owns_parameters(module: nn.Module) -> bool:
    """Whether `module` has parameters of its own (not only through its children)."""
    return any(True for _ in module.parameters(recurse=False))


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
    if owns_parameters(module):
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
