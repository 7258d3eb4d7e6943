"""One flat vector per model: every trainable floating-point parameter and every floating buffer is a view into it.

Loading a client's or a cluster's model is then one `copy_` and reading it back one `clone`, aggregation is
a matrix product over stacked vectors, and a personalization rule is a boolean mask over the vector. The
gradients get the same treatment, so that a local-objective correction (FedProx's proximal term) is one
fused operation over the whole model.

A parameter that does not require a gradient when the flat model is built (a pretrained network's frozen base under
LoRA adapters) is left out: it is held once by the module, shared by every client, never copied into a client's row,
sent, aggregated or checkpointed (`frozen_fingerprint` identifies it so a resume can check it is the same). Buffers
stay in the vector even under a frozen base: BatchNorm's statistics change in training, so they are each client's.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Entry:
    """Where one named tensor of the model lives in the flat vector."""

    name: str
    start: int
    shape: torch.Size
    is_parameter: bool
    layer: str

    @property
    def numel(self) -> int:
        """How many entries the tensor has."""
        return self.shape.numel()

    @property
    def stop(self) -> int:
        """Where the tensor ends in the flat vector (exclusive): `start + numel`."""
        return self.start + self.numel


def _floating_tensors(module: nn.Module) -> list[tuple[str, nn.Module, str, Tensor, bool]]:
    """(qualified name, owner module, attribute, tensor, is_parameter) in registration order: the floating buffers
    and the parameters that require a gradient (the others are the frozen base, `frozen_parameters`)."""
    found, seen = [], set()
    for prefix, owner in module.named_modules():
        for attr, tensor in list(owner._parameters.items()) + list(owner._buffers.items()):
            if tensor is None or not tensor.is_floating_point() or id(tensor) in seen:
                continue
            seen.add(id(tensor))
            is_param = attr in owner._parameters
            if is_param and not tensor.requires_grad:
                continue
            found.append((f"{prefix}.{attr}" if prefix else attr, owner, attr, tensor, is_param))
    return found


def frozen_parameters(module: nn.Module) -> list[tuple[str, Tensor]]:
    """(name, tensor) of the parameters that take no gradient: the frozen base, outside the flat vector."""
    return [(name, p) for name, p in module.named_parameters() if not p.requires_grad]


def frozen_fingerprint(module: nn.Module) -> dict[str, object]:
    """What identifies the frozen base: its tensor count, entries and a SHA-256 of their bytes in name order (read
    once, at set-up; a run's checkpoint keeps it, and a resume refuses another base in one line)."""
    digest = hashlib.sha256()
    tensors = frozen_parameters(module)
    for name, tensor in tensors:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return {"tensors": len(tensors), "entries": sum(t.numel() for _, t in tensors), "sha256": digest.hexdigest()}


def _layer_of(name: str, layer_names: list[str]) -> str:
    """The layer a tensor belongs to: the longest declared layer prefix, else its owning module."""
    best = ""
    for layer in layer_names:
        if (name == layer or name.startswith(layer + ".")) and len(layer) > len(best):
            best = layer
    return best or name.rpartition(".")[0]


class FlatModel:
    """Binds a module's floating tensors (parameters and buffers) to views of one flat vector.

    The module keeps working as usual (optimizers, autograd, BatchNorm's in-place statistics), but its
    state can be read and written in one operation. Integer buffers (BatchNorm's batch counter) are left
    alone: they are not federated.
    """

    def __init__(self, module: nn.Module) -> None:
        tensors = _floating_tensors(module)
        if not tensors:
            raise ValueError(
                f"{type(module).__name__} has no trainable floating-point parameters or buffers to federate"
            )
        network_layers = declared_layers(module)
        ref = tensors[0][3]
        total = sum(t.numel() for *_, t, _ in tensors)
        self.vector = torch.empty(total, dtype=ref.dtype, device=ref.device)
        self.grad = torch.zeros(total, dtype=ref.dtype, device=ref.device)
        entries, offset = [], 0
        for name, owner, attr, tensor, is_param in tensors:
            if tensor.dtype != ref.dtype or tensor.device != ref.device:
                raise ValueError(
                    f"{name} is {tensor.dtype} on {tensor.device}; every floating tensor must share "
                    f"{ref.dtype} on {ref.device}"
                )
            view = self.vector[offset : offset + tensor.numel()].view_as(tensor)
            view.copy_(tensor.detach())
            if is_param:
                tensor.data = view
                tensor.grad = self.grad[offset : offset + tensor.numel()].view_as(tensor)
            else:
                owner._buffers[attr] = view
            entries.append(Entry(name, offset, tensor.shape, is_param, _layer_of(name, network_layers)))
            offset += tensor.numel()
        self.entries: list[Entry] = entries
        self.module = module
        self._parameters = {name: tensor for name, _, _, tensor, is_param in tensors if is_param}

    @property
    def numel(self) -> int:
        """The length of the flat vector: every entry of the module's floating parameters and buffers."""
        return self.vector.numel()

    def load(self, vector: Tensor) -> None:
        """Make the module's state equal to `vector` (one copy)."""
        self.vector.copy_(vector)

    def read(self) -> Tensor:
        """A copy of the module's current state."""
        return self.vector.clone()

    def zero_grad(self) -> None:
        """Zero the flat gradient (every parameter's `.grad` is a view of it, outside `fresh_gradients`)."""
        self.grad.zero_()

    @contextmanager
    def fresh_gradients(self) -> Iterator[Callable[[], None]]:
        """Within: the parameters' gradients start as None, so each backward hands over new gradient tensors
        instead of adding into views of `self.grad` (autograd then skips a read-add-write of every gradient and the
        zeroing before it: about a tenth of a small CNN's step on a CPU). Yields the call that drops them after a
        step; `self.grad` is not kept current inside. At exit the views are bound again, zeroed. The numbers are
        the same: adding a gradient into zeros gives the gradient."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        views = [p.grad for p in params]

        def drop() -> None:
            for p in params:
                p.grad = None

        drop()
        try:
            yield drop
        finally:
            for p, view in zip(params, views):
                p.grad = view
            self.grad.zero_()

    def frozen_tensors(self, trainable: Tensor | None) -> list[str]:
        """Names of the parameter tensors with no trainable entry in `trainable` ((d,) bool), when at least one
        parameter tensor keeps one (else none: something must train)."""
        if trainable is None:
            return []
        frozen = [e.name for e in self.entries if e.is_parameter and not bool(trainable[e.start : e.stop].any())]
        return frozen if len(frozen) < len(self._parameters) else []

    @contextmanager
    def without_gradients(self, names: list[str]) -> Iterator[None]:
        """Within: the named parameters take no gradient (`requires_grad` off), so backward stops where only they
        lie behind it: training a head with its body frozen costs the head's backward, not the model's. Their
        gradient views are unbound too (`grad` None), so the optimizer skips them: no step, no weight decay, no
        momentum for a tensor that is frozen whole. At exit the views are bound again."""
        tensors = [self._parameters[name] for name in names]
        views = [tensor.grad for tensor in tensors]
        for tensor in tensors:
            tensor.requires_grad_(False)
            tensor.grad = None
        try:
            yield
        finally:
            for tensor, view in zip(tensors, views):
                tensor.requires_grad_(True)
                tensor.grad = view

    def views(self, vector: Tensor) -> dict[str, Tensor]:
        """Each named tensor's entries of `vector` ((..., d): one flat model of this layout, or rows of them) as a
        view shaped like the module's tensor (with the leading dimensions in front)."""
        return {e.name: vector[..., e.start : e.stop].unflatten(-1, e.shape) for e in self.entries}

    def tensors_mask(self, names: list[str]) -> Tensor:
        """True on the entries of the named tensors."""
        chosen = set(names)
        return self.mask(lambda e: e.name in chosen)

    def layers(self) -> list[str]:
        """Layer names in model order (from the network's `layer_names()` when it has one)."""
        return list(dict.fromkeys(e.layer for e in self.entries))

    def mask(self, select: Callable[[Entry], bool]) -> Tensor:
        """A boolean mask over the flat vector, True where `select(entry)` holds."""
        mask = torch.zeros(self.numel, dtype=torch.bool, device=self.vector.device)
        for e in self.entries:
            if select(e):
                mask[e.start : e.stop] = True
        return mask

    def parameter_mask(self) -> Tensor:
        """True on trainable parameters, False on buffers (running statistics)."""
        return self.mask(lambda e: e.is_parameter)

    def layer_mask(self, layers: list[str]) -> Tensor:
        """True on every tensor of the named layers."""
        unknown = set(layers) - set(self.layers())
        if unknown:
            raise ValueError(f"unknown layers {sorted(unknown)}; the model's layers are {self.layers()}")
        chosen = set(layers)
        return self.mask(lambda e: e.layer in chosen)


def declared_layers(module: nn.Module) -> list[str]:
    """The layer names a network declares through `layer_names()`, looked up on the module or its children."""
    for prefix, sub in module.named_modules():
        names = getattr(sub, "layer_names", None)
        if callable(names):
            return [f"{prefix}.{n}" if prefix else n for n in names()]
    return []
