"""The model as a method may extend it before the run starts, and the features a network's head reads.

Some personalized methods train modules of their own beside the configured network: a personal head (FedRoD), a
per-client shift of the features (FedDBE), a conditional policy (FedCP). Added through `ModelParts.add` in
`Algorithm.extend_model`, before the engine lays the module's tensors out as one flat vector, such a module's
tensors are entries of every client's flat model like the network's own: trained vectorized by the group training,
kept in the client-state store, checkpointed, and averaged or kept personal by mask (`server.model.layer_mask([name])`).
The network's forward does not call them; the method calls them in its local objective (`LocalWork.objective`) and
its evaluation, or hooks them onto the head (`head.register_forward_pre_hook`).

The head is the network's last layer (its declared `layer_names()`, else the last module owning parameters), and
its input is what these methods call the features (the representation): `head_inputs` returns it beside the
outputs, inside a vectorized objective as well as in evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn
from torch.func import functional_call

from fedlight.training.flat import declared_layers
from fedlight.training.layer_masks import owns_parameters


def head_name(module: nn.Module) -> str | None:
    """The qualified name of the network's last layer: its declared `layer_names()`' last, else the last submodule
    that owns parameters (None: a model without any, such as the centroid models of local k-means)."""
    declared = declared_layers(module)
    if declared:
        return declared[-1]
    owners = [name for name, sub in module.named_modules() if name and owns_parameters(sub)]
    return owners[-1] if owners else None


def head_of(module: nn.Module, name: str | None) -> nn.Module:
    """The head named `name` (`head_name`), or a one-line refusal for a model without a layer."""
    if name is None:
        raise ValueError(
            f"{type(module).__name__} has no layer with parameters: there is no head to read features "
            "at; use a network that ends with a layer (nn.Linear)"
        )
    return module.get_submodule(name)


def head_inputs(module: nn.Module, head: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """(features, outputs) of `module` on `x`: the input the head receives (as the network computes it, before any
    pre-hook a method registered on the head changes it) and the module's outputs, from one forward pass."""
    captured: list[Tensor] = []
    handle = head.register_forward_pre_hook(lambda _, args: captured.append(args[0]), prepend=True)
    try:
        outputs = module(x)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise ValueError(
            f"the head ({type(head).__name__}) ran {len(captured)} times in one forward pass; "
            "features are read at a head that runs once"
        )
    if captured[0].dim() != 2:  # a head applied to every position of a sequence, pooled after it (GPT-2's score)
        raise ValueError(
            f"the head ({type(head).__name__}) reads inputs of shape {tuple(captured[0].shape)}, not one "
            "feature row a sample: a method that reads the features at the head needs a network that "
            "pools before its head (BERT, ViT, a CNN), not one that pools its outputs (GPT-2)"
        )
    return captured[0], outputs


class _Features(nn.Module):
    """The features (the head's input) of `inner` as a forward pass, for `functional_call` to run with other weights."""

    def __init__(self, module: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.inner = module
        self._head = (head,)  # a submodule of `inner`, not registered twice

    def forward(self, x: Tensor) -> Tensor:
        return head_inputs(self.inner, self._head[0], x)[0]


def features_with(module: nn.Module, head: nn.Module, weights: dict[str, Tensor], x: Tensor) -> Tensor:
    """The features of `module` on `x` with the tensors `weights` (by qualified name: `server.model.named_tensors` of
    a flat model, or some of them) in place of its own, through `torch.func.functional_call`, so that it runs inside a
    vectorized objective: another model's representation of the client's batch (FedCP's global body, MOON's global and
    previous models). Buffers among `weights` are copied first, so BatchNorm in training mode moves copies; the
    module's own tensors stand in for the names left out."""
    buffers = {name for name, _ in module.named_buffers()}
    tensors = {f"inner.{name}": (t.clone() if name in buffers else t) for name, t in weights.items()}
    return functional_call(_Features(module, head), tensors, (x,))


@dataclass
class ModelParts:
    """The run's module before its tensors are laid out (`Algorithm.extend_model`): its head and class count, and
    `add` for a method's own modules."""

    module: nn.Module
    head_name: str | None
    num_classes: int

    @property
    def head(self) -> nn.Module:
        """The module's head, the layer named `head_name` (`head_of`: a one-line refusal when it has none)."""
        return head_of(self.module, self.head_name)

    def feature_size(self, method: str) -> int:
        """The width of the features (the head's input): a linear head's `in_features`; a method that needs the
        features refuses another head in one line."""
        size = getattr(self.head, "in_features", None)
        if not isinstance(size, int):
            raise ValueError(
                f"{method} reads the features at the network's head, which must be a linear layer; "
                f"{self.head_name} is a {type(self.head).__name__}: end the network with nn.Linear "
                "(or declare layer_names() whose last is it)"
            )
        return size

    def add(self, name: str, part: nn.Module) -> None:
        """Add `part` to the module as `name` (a layer of its own in the flat model's layout)."""
        if hasattr(self.module, name):
            raise ValueError(f"the model already has an attribute {name!r}: give the method's module another name")
        self.module.add_module(name, part)
