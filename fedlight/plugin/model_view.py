"""`ModelView`: the run's network as an algorithm uses it (`server.model`): flat models run, differentiated and
re-initialized, and the network's layout as boolean masks over the flat parameter vector."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal

import torch
from torch import Tensor, nn

from fedlight.plugin import model_parts
from fedlight.plugin.channels_last import channels_last_on_cpu
from fedlight.plugin.eval_rows import CPU_MOST_ROWS, cpu_eval_rows
from fedlight.training.flat import FlatModel
from fedlight.training.layer_masks import layer_count_mask
from fedlight.training.sequential import ClientTrainer, sample_loss

if TYPE_CHECKING:  # type-only: importing Lightning costs seconds, and `fit --help` need not
    import lightning as L

GroupGradients = Callable[[Tensor, Tensor, Tensor, int], "tuple[Tensor, Tensor] | None"]
"""(params (k, d), x, y, step) -> (losses, flat gradients) vectorized, or None where the plan does not vectorize."""


class ModelView:
    """The model clients train, seen as flat parameter vectors of `num_params` entries.

    Attributes:
        module: the LightningModule clients train; read its attributes (a centroid model's k), but change its
            weights only through the methods below, which load a flat model into it.
        num_params: entries of a flat model.
        initial_params: the model's initial flat parameters (do not write into it; clone first).
    """

    def __init__(
        self,
        module: L.LightningModule,
        flat: FlatModel,
        trainer: ClientTrainer,
        fabric: L.Fabric,
        inputs: Callable[[Tensor], Tensor],
        eval_batch_size: int | None,
        head_name: str | None = None,
    ) -> None:
        self.module = module
        self._flat, self._trainer, self._fabric, self._inputs = flat, trainer, fabric, inputs
        self._head_name = head_name if head_name is not None else model_parts.head_name(module)
        prefix = f"{self._head_name}."
        #: the head's tensors in the flat vector, by their names inside the head (none without a head)
        self._head_entries = [
            (e.name[len(prefix) :], e)
            for e in flat.entries
            if self._head_name is not None and e.name.startswith(prefix)
        ]
        self._eval_batch_size = eval_batch_size
        self._cpu_rows: dict[tuple[int, ...], int] = {}  # rows a pass by input shape, where eval_batch_size is None
        self.num_params = flat.numel
        self.initial_params = flat.read()
        self._group_gradients: GroupGradients = lambda params, x, y, step: None
        self.on_gradient_pass: Callable[[], None] = lambda: None  # counts a custom loop's pass as its clients' step

    def bind_group_gradients(self, group_gradients: GroupGradients) -> None:
        """The engine's vectorized gradients (`fedlight.engine.group_training`), which `group_loss_and_grad` asks
        first (set by the engine once its plan is made)."""
        self._group_gradients = group_gradients

    # -- running the model -----------------------------------------------------------------------------
    @property
    def head(self) -> torch.nn.Module:
        """The network's last layer, whose input is the features (`fedlight.plugin.model_parts`): methods that read
        the representation in a local objective run `head_inputs(module, server.model.head, x)`."""
        return model_parts.head_of(self.module, self._head_name)

    def predict(self, params: Tensor, x: Tensor) -> Tensor:
        """The class logits (N, classes) of the flat model `params` on raw inputs `x`, in evaluation mode, in batches
        of `federation.eval_batch_size`, as float32. A module whose outputs are not class logits (a causal language
        model's per-token scores) is refused in one line: what reads class probabilities cannot run on it."""
        outputs = self.outputs(params, x)
        if outputs.dim() != 2:
            raise ValueError(
                f"this method reads class probabilities, and {type(self.module).__name__}'s outputs are "
                f"{tuple(outputs.shape[1:])} per sample, not class logits: use a classifier, or a method "
                "that needs only the module's loss"
            )
        return outputs

    def outputs(self, params: Tensor, x: Tensor) -> Tensor:
        """The module's outputs (whatever their shape) of the flat model `params` on raw inputs `x`, as `predict`
        runs it: what evaluation and per-sample losses read (`sample_loss`)."""
        return self._evaluate(params, x)[1]

    def sample_losses(self, params: Tensor, x: Tensor, y: Tensor) -> Tensor:
        """(N,) each sample's loss (`fedlight.training.sequential.sample_loss`) under the flat model `params`, in
        `outputs`' batched passes."""
        return sample_loss(self.module, self.outputs(params, x), y)

    def features(self, params: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """(features, outputs) of the flat model `params` on raw inputs `x` as `predict` runs it: the head's input
        beside the logits, float32 (class prototypes, a domain's mean representation)."""
        features, outputs = self._evaluate(params, x, features=True)
        assert features is not None
        return features, outputs

    @torch.no_grad()
    def head_outputs(self, params: Tensor, features: Tensor) -> Tensor:
        """The head of the flat model `params` on `features` (the head's inputs, as `features` gives them), as
        float32 in evaluation mode: the outputs of a model that ends with its head, without running its body."""
        head_tensors = {name: params[e.start : e.stop].view(e.shape) for name, e in self._head_entries}
        self.module.eval()
        outputs = []
        with self._fabric.autocast():
            size = self._eval_batch_size or CPU_MOST_ROWS  # features: a vector a row
            for begin in range(0, max(len(features), 1), size):
                batch = features[begin : begin + size]
                outputs.append(torch.func.functional_call(self.head, head_tensors, (batch,)).float())
        return torch.cat(outputs)

    def named_tensors(self, params: Tensor) -> dict[str, Tensor]:
        """The module's parameters and buffers by qualified name (`named_parameters()`' names) as views of the flat
        model `params` ((d,), or (..., d) rows): another model's weights for `torch.func.functional_call` inside an
        objective (FedCP's frozen global body beside the client's own), a named tensor of every row."""
        return self._flat.views(params)

    @torch.no_grad()
    def _evaluate(self, params: Tensor, x: Tensor, features: bool = False) -> tuple[Tensor | None, Tensor]:
        self._flat.load(params)
        self.module.eval()
        inputs, outputs = [], []
        with channels_last_on_cpu(self.module):
            size = self._rows(x)
            for begin in range(0, max(len(x), 1), size):  # an empty x still gives a (0, ...) output
                batch = self._inputs(x[begin : begin + size])
                with self._fabric.autocast():
                    if features:
                        feature, output = model_parts.head_inputs(self.module, self.head, batch)
                        inputs.append(feature.float())
                    else:
                        output = self.module(batch)
                    outputs.append(output.float())
        return (torch.cat(inputs) if features else None), torch.cat(outputs)

    def _rows(self, x: Tensor) -> int:
        """Rows a forward pass: `federation.eval_batch_size` (or the accelerator's default), else, on a CPU, the most
        whose largest activation stays under 32 MiB, read once per input shape (`fedlight.plugin.eval_rows`)."""
        if self._eval_batch_size is not None:
            return self._eval_batch_size
        if len(x) == 0:
            return CPU_MOST_ROWS
        shape = tuple(x.shape[1:])
        if shape not in self._cpu_rows:
            with self._fabric.autocast():
                self._cpu_rows[shape] = cpu_eval_rows(self.module, self._inputs(x[:1]))
        return self._cpu_rows[shape]

    def loss_and_grad(self, params: Tensor, batch: Any, step: int = 0) -> tuple[Tensor, Tensor]:
        """(loss, flat gradient) of the module's `training_step` on `batch` at the flat model `params`."""
        self.on_gradient_pass()
        return self._trainer.loss_and_grad(params, batch, step)

    def group_loss_and_grad(self, params: Tensor, batch: Any, step: int = 0) -> tuple[Tensor, Tensor]:
        """(losses (k,), flat gradients (k, d)) of the module's `training_step` at k flat models, each on its own
        batch of a `GroupStep`: vectorized when the plan allows, else `loss_and_grad` one model after another."""
        x, y = batch
        self.on_gradient_pass()
        vectorized = self._group_gradients(params, x, y, step)
        if vectorized is not None:
            return vectorized
        pairs = [self._trainer.loss_and_grad(p, (x[i], y[i]), step) for i, p in enumerate(params)]
        return torch.stack([loss for loss, _ in pairs]), torch.stack([grad for _, grad in pairs])

    def random_params(self, seed: int) -> Tensor:
        """A fresh random initialization of the model (every submodule's `reset_parameters`) as a flat vector,
        for cluster models that start from independent initializations. A submodule with a frozen parameter (a
        pretrained base, outside the flat vector), its own or below it, is left alone: the base is shared by every
        model and never redrawn. Under LoRA the adapters' A and B are then both drawn at random (their layers' own
        reset), so k cluster models start apart rather than all at the base's function, where every client would
        tie."""
        saved = self._flat.read()
        device = next(iter(self.module.parameters()), torch.empty(0)).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            for sub in self.module.modules():
                frozen = any(not p.requires_grad for p in sub.parameters())
                reset = getattr(sub, "reset_parameters", None)
                if callable(reset) and not frozen:
                    reset()
        fresh = self._flat.read()
        self._flat.load(saved)
        return fresh

    # -- the model's layout ----------------------------------------------------------------------------
    def layers(self) -> list[str]:
        """The network's layer names, input to output (its `layer_names()` when it declares them)."""
        return self._flat.layers()

    def layer_mask(self, layers: list[str]) -> Tensor:
        """True on every entry of the flat vector that belongs to one of the named layers."""
        return self._flat.layer_mask(layers)

    def layer_count_mask(self, count: float, side: Literal["first", "last"] = "first") -> Tensor:
        """True on the first (or last) `count` layers; a half count takes half of the boundary layer
        (`fedlight.training.layer_masks.layer_count_mask`)."""
        return layer_count_mask(self._flat, count, side)

    def head_mask(self, count: float, option: str, side: Literal["first", "last"] = "last") -> Tensor:
        """`layer_count_mask(count, side)` for one side of a body/head split (a personal head, a shared body): a
        count that takes the whole network, leaving nothing on the other side, is refused in one line naming
        `option`, the algorithm's setting."""
        layers = self.layers()
        if count >= len(layers):
            raise ValueError(
                f"{option} is {count:g}, the whole network ({len(layers)} layers: {', '.join(layers)}): "
                f"give fewer than {len(layers)}, so that the split leaves layers on both sides"
            )
        return self.layer_count_mask(count, side)

    def tensors_mask(self, names: list[str]) -> Tensor:
        """True on the entries of the named parameter tensors (qualified names, as `module.named_parameters()`
        gives them); a name that is not a federated tensor is refused in one line."""
        known = {e.name for e in self._flat.entries}
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(
                f"{unknown[0]} is not a federated tensor of the model (a frozen one is outside the "
                "federated parameters)"
            )
        return self._flat.tensors_mask(names)

    def last_layer_mask(self) -> Tensor:
        """True on the head's tensors (the network's last layer, `head`): what `head_outputs` reads; all False for a
        network without a layer of parameters."""
        return self._flat.tensors_mask([e.name for _, e in self._head_entries])

    def module_mask(self, kinds: tuple[type[nn.Module], ...]) -> Tensor:
        """True on the parameters and buffers of every submodule of one of the given types (e.g. all BatchNorm
        layers, wherever they sit in the network's layer list)."""
        model = self._flat.module
        return self._flat.mask(lambda e: isinstance(model.get_submodule(e.name.rpartition(".")[0]), kinds))

    def parameter_mask(self) -> Tensor:
        """True on trainable parameters, False on buffers (e.g. BatchNorm running statistics)."""
        return self._flat.parameter_mask()
