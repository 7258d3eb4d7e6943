"""`LocalWork`: what one call of group training does beyond the module's SGD on the clients' batches.

An algorithm's local work is one or more calls of `ServerContext.clients.train_many` on a group of clients; each call
says, in one value, how many epochs, at which learning-rate factor, with which gradient correction, which entries
train, how the samples are weighted, and which stream of batches it draws. The engine carries it out vectorized
or one client after another, as the run's plan says, so the algorithm never loops over clients itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import Tensor

from fedlight.training.sequential import Objective
from fedlight.training.vectorized import GroupHook


@dataclass(frozen=True)
class LocalWork:
    """One call of local training on a group of clients.

    Attributes:
        epochs: local epochs (None: the federation's `local_epochs`).
        lr_scale: factor on the module's configured learning rate of the round.
        gradient_hook: `hook(rows, params, grad, starts)` edits the (len(rows), d) flat gradients in place after
            every backward pass; `rows` are the clients' positions in the call's `clients`.
        trainable: (d,) bool, True on the entries that train; the others (buffers included) keep their starting
            values: their gradient is zeroed at every step and they are restored at the end (None: all train).
        sample_weights: one (samples,) tensor per client, one weight per row of its training split: each step's
            loss is then the batch mean of weight x cross-entropy of the module's outputs (None: `training_step`).
        purpose: the stream of batches (and dropout) drawn: "train" is the round's ordinary stream; another name
            draws an independent one with the same batch sizes.
        objective: `objective(module, (x, y), inputs)`, the loss of a batch in place of `training_step`, with the
            module running on the client's weights (vectorized under `torch.func`, so no `.item()` or data-dependent
            Python branching): a regularized or multi-head local objective (FedProto's prototype distance, FedRoD's
            balanced softmax); `fedlight.plugin.features` gives the head's input beside the outputs.
        client_inputs: (clients, ...), one row per client handed to `objective` as `inputs` (its class counts, say);
            None: an empty (0,) tensor.
    """

    epochs: int | None = None
    lr_scale: float = 1.0
    gradient_hook: GroupHook | None = None
    trainable: Tensor | None = None
    sample_weights: list[Tensor] | None = None
    purpose: str = "train"
    objective: Objective | None = None
    client_inputs: Tensor | None = None

    def __post_init__(self) -> None:
        if self.objective is not None and self.sample_weights is not None:
            raise ValueError(
                "LocalWork takes sample_weights or an objective, not both: weigh the samples inside the "
                "objective (pass the weights through client_inputs)"
            )
        if self.client_inputs is not None and self.objective is None:
            raise ValueError("LocalWork.client_inputs are handed to an objective: give one, or leave them out")

    def hook(self, unstepped: Tensor | None = None) -> GroupHook | None:
        """The gradient hook the trainers run: the algorithm's correction, then the frozen entries zeroed.
        `unstepped` ((d,) bool): entries the trainer's optimizer never steps (buffers, parameter tensors frozen whole
        and unbound from the optimizer, `FlatModel.without_gradients`); zeroing their gradient would change nothing,
        so only the other frozen entries are zeroed, and with none left the hook is the algorithm's alone (None
        lets the sequential trainer skip the flat gradient altogether)."""
        if self.trainable is None:
            return self.gradient_hook
        frozen, inner = ~self.trainable, self.gradient_hook
        if unstepped is not None:
            frozen = frozen & ~unstepped
            if not bool(frozen.any()):
                return inner

        def hook(rows: list[int], params: Tensor, grad: Tensor, starts: Tensor) -> None:
            if inner is not None:
                inner(rows, params, grad, starts)
            grad.masked_fill_(frozen, 0)

        return hook

    def for_rows(self, rows: list[int]) -> "LocalWork":
        """This work for the clients at positions `rows` of its call, as a call of their own: the gradient hook is
        told their positions in the whole call, the sample weights and the objective's inputs are theirs."""
        inner = self.gradient_hook
        hook = (
            None
            if inner is None
            else (lambda at, params, grad, starts: inner([rows[r] for r in at], params, grad, starts))
        )
        weights = None if self.sample_weights is None else [self.sample_weights[r] for r in rows]
        inputs = None if self.client_inputs is None else self.client_inputs[rows]
        return replace(self, gradient_hook=hook, sample_weights=weights, client_inputs=inputs)

    def restore_frozen(self, params: Tensor, starts: Tensor) -> None:
        """Set the entries that do not train back to their starting values (weight decay and BatchNorm's running
        statistics move them within the call)."""
        if self.trainable is not None:
            frozen = ~self.trainable
            params[:, frozen] = starts[:, frozen]
