"""Vectorized client training: the clients of a round train together as one batched computation.

FL simulators are slow because they train hundreds of tiny models one after another. Here the clients'
parameters are stacked into one (clients, parameters) matrix and the module's own `training_step` is run
through `torch.func.vmap(grad_and_value(...))` over the client dimension, so one step of C clients is one
set of kernel launches. Each client takes exactly the batches it would take alone: the same per-client
permutation stream as the sequential trainer. Clients train largest first, so a step where some have a shorter
(last) batch or none left runs as contiguous ranges of rows of equal batch size. The results equal sequential
training's up to float rounding, with one caveat: where max pooling meets exactly equal activations, the batched
kernel may route the gradient to another of the tied positions (an equally valid subgradient). The optimizer is
applied functionally to the stacked rows with the hyper-parameters of the module's own optimizer (SGD with
momentum/Nesterov/weight decay, Adam, AdamW), at the learning rates of its schedulers (`fedlight.training.schedules`).
Buffers are per client too: BatchNorm's running statistics are a (clients, ...) tensor each, updated in place by the
vmapped step as each client's own would be. What `training_step` logs comes back beside the loss, one value per client
(`fedlight.training.step_logs`). Modules that cannot be vectorized (other optimizers, several parameter groups, a
gradient scaler, cumulative BatchNorm averages) are reported by `unsupported_reason` and trained sequentially.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.modules.batchnorm import _BatchNorm

from fedlight.training.client_pooling import clients_in_channels
from fedlight.training.flat import FlatModel
from fedlight.training.schedules import LearningRates
from fedlight.training.step_logs import LogSums, StepLogs
from fedlight.training.sequential import Objective, Trained, sample_order, seed_random_layers, step_loss
from fedlight.training.trainer_stand_in import TrainerStandIn

if TYPE_CHECKING:  # type-only: importing Lightning costs seconds, and `fit --help` need not
    import lightning as L

#: (rows, params, grad, starts) of several clients at once: `rows` are their positions in the group as given, the
#: tensors (len(rows), d) full-length flat rows; the hook edits `grad` in place
GroupHook = Callable[[list[int], Tensor, Tensor, Tensor], None]


@contextmanager
def batch_norm_in_its_own_dtype(module: nn.Module) -> Iterator[None]:
    """Under mixed precision, hand BatchNorm its input in the dtype of its statistics. Outside vmap the kernel
    takes a bf16 input with float32 statistics; vmap's batching rule for batch_norm does not, so the vectorized
    step casts the input up (the normalization then runs in float32, as the mixed kernel computes it)."""

    def cast(bn: nn.Module, args: tuple) -> tuple | None:
        reference = bn.running_mean if bn.running_mean is not None else bn.weight
        if reference is None or args[0].dtype == reference.dtype:
            return None
        return (args[0].to(reference.dtype), *args[1:])

    handles = [m.register_forward_pre_hook(cast) for m in module.modules() if isinstance(m, _BatchNorm)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class _TrainingStep(nn.Module):
    """Makes a step's loss (`training_step`, the weighted cross-entropy of per-sample weights, or the algorithm's
    objective: `step_loss`) the forward of a module, so `functional_call` can run it with given weights; returns
    (loss, what the step logged)."""

    def __init__(self, inner: L.LightningModule) -> None:
        super().__init__()
        self.inner = inner
        self.logs: StepLogs | None = None
        self.objective: Objective | None = None  # set for a call by the group training (`LocalWork.objective`)

    def forward(
        self, batch, batch_idx: int, weights: Tensor | None = None, inputs: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        loss = step_loss(self.inner, batch, batch_idx, weights, self.objective, inputs)
        return loss, self.logs.take() if self.logs is not None else {}


def unsupported_reason(module: nn.Module, optimizer: torch.optim.Optimizer, scaler) -> str | None:
    """Why this module/optimizer cannot be trained vectorized, or None when it can."""
    if not getattr(module, "automatic_optimization", True):
        return "the module uses manual optimization"
    for name, sub in module.named_modules():
        if getattr(sub, "track_running_stats", False) and getattr(sub, "momentum", 0.1) is None:
            return f"{name} ({type(sub).__name__}) keeps a cumulative average (momentum=None), which is not per client"
    if type(optimizer) not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        return f"the optimizer {type(optimizer).__name__} has no vectorized form (SGD, Adam, AdamW have)"
    if len(optimizer.param_groups) != 1:
        return "the optimizer has several parameter groups"
    group = optimizer.param_groups[0]
    if group.get("amsgrad") or group.get("maximize"):
        return "amsgrad/maximize are not vectorized"
    if scaler is not None:
        return "16-mixed precision's gradient scaler is not vectorized (use bf16-mixed)"
    return None


class FunctionalOptimizer:
    """torch.optim's SGD / Adam / AdamW update rules on stacked rows, one row per client.

    A step updates a contiguous range of rows in place, through one view per parameter tensor of the stored
    matrices (parameters, momentum or moment buffers), with `torch._foreach_*` operations: no row is gathered or
    scattered and no gradient is concatenated. Which rows have a momentum buffer is known on the host, so no step
    reads a value back from the device."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.kind = type(optimizer).__name__
        self.h = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}

    def init_state(self, params: Tensor) -> dict[str, Any]:
        """The optimizer state of the rows `params`, zeroed: SGD's momentum buffers (None without momentum) and which
        rows have started them; Adam's moments `m`, `v` and step counts `t`."""
        if self.kind == "SGD":  # without momentum, no buffer: `step` never reads it
            return {
                "momentum": torch.zeros_like(params) if self.h["momentum"] else None,
                "started": [False] * len(params),
            }
        zeros = torch.zeros_like(params)
        return {"m": zeros, "v": zeros.clone(), "t": torch.zeros(len(params), dtype=params.dtype, device=params.device)}

    def step(
        self,
        params: list[Tensor],
        grads: list[Tensor],
        state: dict[str, Any],
        views: Callable,
        rows: range,
        lr: float | Tensor,
    ) -> None:
        """Update `params` (views of rows `rows`, one per parameter tensor) in place from `grads` (consumed) at
        learning rate `lr` (one for all rows, or one per row); `views(matrix)` gives the same views of a state
        matrix."""
        h = self.h
        if self.kind == "SGD":
            if h["weight_decay"]:
                torch._foreach_add_(grads, params, alpha=h["weight_decay"])
            direction = grads
            if h["momentum"]:
                direction = self._momentum(grads, views(state["momentum"]), state["started"], rows)
            _add_scaled(params, direction, lr, -1.0)
            return
        beta1, beta2 = h["betas"]
        if self.kind == "AdamW" or h.get("decoupled_weight_decay", False):
            if isinstance(lr, float):
                torch._foreach_mul_(params, 1 - lr * h["weight_decay"])
            else:
                for p in params:
                    p.mul_(_per_row(1 - lr * h["weight_decay"], p))
        elif h["weight_decay"]:
            torch._foreach_add_(grads, params, alpha=h["weight_decay"])
        m, v, t = views(state["m"]), views(state["v"]), state["t"][rows.start : rows.stop]
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, grads, alpha=1 - beta1)
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
        t.add_(1)
        step_size, root2 = lr / (1 - beta1**t), (1 - beta2**t).sqrt()
        for p, m_, v_ in zip(params, m, v):
            p.sub_(_per_row(step_size, p) * m_ / (v_.sqrt() / _per_row(root2, p) + h["eps"]))

    def _momentum(self, grads: list[Tensor], bufs: list[Tensor], started: list[bool], rows: range) -> list[Tensor]:
        """SGD's momentum buffer update (the buffer starts as the first gradient); returns the step direction.
        `bufs` are updated in place; with Nesterov the direction is g + momentum * buf."""
        h = self.h
        first = [not started[r] for r in rows]
        if all(first):
            torch._foreach_copy_(bufs, grads)
        elif not any(first):
            torch._foreach_mul_(bufs, h["momentum"])
            torch._foreach_add_(bufs, grads, alpha=1 - h["dampening"])
        else:
            fresh = torch.tensor(first, device=grads[0].device)
            for g, buf in zip(grads, bufs):
                buf.copy_(torch.where(_per_row(fresh, g), g, h["momentum"] * buf + (1 - h["dampening"]) * g))
        for r in rows:
            started[r] = True
        if h["nesterov"]:
            torch._foreach_add_(grads, bufs, alpha=h["momentum"])
            return grads
        return bufs


def _per_row(values: Tensor, like: Tensor) -> Tensor:
    """(rows,) values shaped to broadcast over a (rows, ...) tensor."""
    return values.view(len(values), *[1] * (like.dim() - 1))


def _per_row_channels_last(rows: Tensor) -> Tensor:
    """A (rows, out, in, kh, kw) stack of convolution weights copied so each row is in channels-last order, on a CPU
    (other tensors as they are). Under vmap a convolution of per-client weights runs as one grouped convolution whose
    weight is the rows merged (a view); channels-last weights make oneDNN take its channels-last path, 1.7-2.5x
    faster for a grouped convolution's forward and backward than the default layout on this CPU (LeNet-5's two, 20
    clients): the vectorized batch-10 round 1.5x -> 1.85x a plain loop's. Same values, another memory order; the
    gradients come back in it, and the optimizer's elementwise step does not mind."""
    if rows.dim() != 5 or rows.device.type != "cpu":
        return rows
    return rows.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


def _batches_channels_last(x: Tensor) -> Tensor:
    """A (rows, batch, channels, h, w) stack of image batches copied so that, once vmap merges the rows into the
    channels of one grouped convolution's input ((batch, rows * channels, h, w), a view), that input is channels-last:
    the memory order (batch, h, w, rows, channels). On a CPU, oneDNN then runs the first convolution's forward and
    backward on its channels-last path, as it does the later ones (`_per_row_channels_last`): LeNet-5's first
    convolution over 20 clients at batch 10 took 2.5x less time forward and backward. Alone it did not speed up
    every network (a round of LeNet-5 1.08x faster, LeNet-5 with BatchNorm 0.97x, FedAvg's CNN 0.89x): vmap's rule
    for max-pooling copied the channels-last activations into NCHW. With the clients pooled in their channels
    (`fedlight.training.client_pooling`) it is faster for each of them (`VectorizedTrainer.channels_last_inputs`).
    Same values, another memory order; other tensors as they are."""
    if x.dim() != 5 or x.device.type != "cpu" or not x.is_floating_point():
        return x
    return x.permute(1, 3, 4, 0, 2).contiguous().permute(3, 0, 4, 1, 2)


def _add_scaled(params: list[Tensor], direction: list[Tensor], lr: float | Tensor, sign: float) -> None:
    """params += sign * lr * direction, with one learning rate or one per row."""
    if isinstance(lr, float):
        torch._foreach_add_(params, direction, alpha=sign * lr)
    else:
        for p, d in zip(params, direction):
            p.add_(d * _per_row(sign * lr, p))


@dataclass
class _SortedGroup:
    """The clients of one `fit_many` call, sorted by size, largest first (sorted row i is the client given at
    `order[i]`), so that the clients still training at a step are the first rows: their starts, data and number of
    steps per epoch, the rows being trained (parameters, buffers, the optimizer's state) and the sums of the epoch's
    losses and logged values."""

    order: list[int]
    starts: Tensor  # the sorted starts (those given when every row is one expanded model)
    hook: GroupHook | None
    weights: Tensor | None  # every client's per-sample weights, concatenated as `x`
    inputs: Tensor | None  # each client's row of the objective's inputs
    params: Tensor  # (clients, parameters), contiguous: the rows the steps update through views
    buffers: dict[str, Tensor]
    state: dict[str, Any]
    sizes: list[int]
    steps: list[int]
    generators: list[torch.Generator]
    x: Tensor  # every client's samples, concatenated in row order
    y: Tensor
    offsets: Tensor  # each client's first sample in `x` and `y`
    loss_sum: Tensor
    logs: LogSums
    orders: list[Tensor] = field(default_factory=list)  # this epoch's batch order of each client

    @property
    def clients(self) -> int:
        """The number of clients (rows)."""
        return len(self.order)

    @property
    def device(self) -> torch.device:
        """Where the rows are trained."""
        return self.starts.device


class VectorizedTrainer:
    """Trains several clients at once from their flat starting models on the shared module's structure; the module's
    trainer (`stand_in`, attached by the sequential trainer) is told where local training is at every step, in plain
    ints, so `training_step` reads under vmap what it reads alone."""

    def __init__(
        self,
        fabric: L.Fabric,
        module: L.LightningModule,
        flat: FlatModel,
        optimizer: torch.optim.Optimizer,
        learning_rates: LearningRates,
        batch_transform: Callable,
        batch_size: int,
        local_epochs: int,
        stand_in: TrainerStandIn,
    ) -> None:
        self.fabric, self.flat, self.module, self.stand_in = fabric, flat, module, stand_in
        self.batch_transform, self.batch_size, self.local_epochs = batch_transform, batch_size, local_epochs
        self.optimizer = FunctionalOptimizer(optimizer)
        self.learning_rates = learning_rates
        self.step_module = _TrainingStep(module)
        #: the layout question arises (a CPU, a 2-d convolution); `channels_last_inputs` is its answer
        self.layouts_differ = fabric.device.type == "cpu" and any(isinstance(m, nn.Conv2d) for m in module.modules())
        #: the channels-last layout: image batches handed over as `_batches_channels_last` lays them out, and the
        #: clients max-pooled as one pooling over their channels (`fedlight.training.client_pooling`). The default
        #: where the question arises: it trained every convolutional network we ship faster on this CPU, 1.07-1.73x
        #: a round (docs/results.md, "client_pooling.py"); auto's probe still times both (`faster_layout`)
        self.channels_last_inputs = self.layouts_differ
        self.param_mask = flat.parameter_mask()
        self.param_entries = [e for e in flat.entries if e.is_parameter]
        self.buffer_entries = [e for e in flat.entries if not e.is_parameter]
        self.param_offsets = self._offsets(self.param_entries)
        self._names = [f"inner.{e.name}" for e in self.param_entries]
        self._frozen: set[int] = set()  # positions in param_entries that take no gradient (`without_gradients`)
        self._differentiated = self._names
        flat_buffers = {e.name for e in self.buffer_entries}
        self._other_buffers = {f"inner.{name}": b for name, b in module.named_buffers() if name not in flat_buffers}
        self._grad_and_loss = vmap(
            grad_and_value(self._loss, has_aux=True), in_dims=(0, 0, 0, 0, None), randomness="different"
        )
        self._weighted_grad_and_loss = vmap(
            grad_and_value(self._weighted_loss, has_aux=True), in_dims=(0, 0, 0, 0, None, 0), randomness="different"
        )
        self._objective_grad_and_loss = vmap(
            grad_and_value(self._objective_loss, has_aux=True), in_dims=(0, 0, 0, 0, None, 0), randomness="different"
        )

    def activation_bytes(self, x: Tensor, y: Tensor) -> int:
        """Bytes one client's training step on the batch (x, y) keeps for its backward pass (its activations):
        one forward of `training_step` under autograd's saved-tensor hooks, counting each saved tensor once. The
        flat model's own storage (the parameters) is left out, as it is held anyway; the buffers are copies, so
        BatchNorm's statistics do not move. A vectorized group of g clients keeps g times this, which can dwarf
        the parameters (ResNet-34 on 128 images of 28 x 28: about 0.8 GB a client), so group sizes count it."""
        own = self.flat.vector.untyped_storage().data_ptr()
        saved: dict[int, int] = {}

        def pack(tensor: Tensor) -> Tensor:
            if tensor.untyped_storage().data_ptr() != own:  # views of one tensor counted once, at their largest
                start = tensor.data_ptr()
                saved[start] = max(saved.get(start, 0), tensor.numel() * tensor.element_size())
            return tensor

        buffers = {name: b.clone() for name, b in self.step_module.named_buffers()}
        self.step_module.train()
        with (
            StepLogs(self.module) as step_logs,
            torch.random.fork_rng(devices=[]),
            self.fabric.autocast(),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        ):
            self.step_module.logs = step_logs
            functional_call(self.step_module, buffers, (self.batch_transform((x, y), 0), 0))
            self.step_module.logs = None
        return sum(saved.values())

    @staticmethod
    def _offsets(entries) -> list[int]:
        offsets, offset = [], 0
        for e in entries:
            offsets.append(offset)
            offset += e.numel
        return offsets

    def _loss(
        self, tensors: tuple[Tensor, ...], buffers: dict[str, Tensor], x: Tensor, y: Tensor, batch_idx: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return functional_call(
            self.step_module, {**dict(zip(self._differentiated, tensors)), **buffers}, ((x, y), batch_idx)
        )

    def _weighted_loss(
        self,
        tensors: tuple[Tensor, ...],
        buffers: dict[str, Tensor],
        x: Tensor,
        y: Tensor,
        batch_idx: int,
        weights: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return functional_call(
            self.step_module, {**dict(zip(self._differentiated, tensors)), **buffers}, ((x, y), batch_idx, weights)
        )

    def _objective_loss(
        self,
        tensors: tuple[Tensor, ...],
        buffers: dict[str, Tensor],
        x: Tensor,
        y: Tensor,
        batch_idx: int,
        inputs: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        return functional_call(
            self.step_module, {**dict(zip(self._differentiated, tensors)), **buffers}, ((x, y), batch_idx, None, inputs)
        )

    def _buffers(self, starts: Tensor) -> dict[str, Tensor]:
        """Every client's buffers as one (clients, ...) tensor each: the federated ones from the flat rows, the
        others (BatchNorm's batch counter) as per-client copies of the module's. Each must be a tensor of its
        own, not a view: under vmap, BatchNorm's in-place update of a view does not reach the viewed tensor."""
        flat = {
            f"inner.{e.name}": starts[:, e.start : e.stop].reshape(len(starts), *e.shape).clone()
            for e in self.buffer_entries
        }
        others = {name: b.expand(len(starts), *b.shape).clone() for name, b in self._other_buffers.items()}
        return {**flat, **others}

    def _tensor_views(self, matrix: Tensor, rows: range) -> list[Tensor]:
        """One (rows, *shape) view per parameter tensor of the rows `rows` of a (clients, parameters) matrix."""
        block = matrix[rows.start : rows.stop]
        return [
            block[:, o : o + e.numel].view(len(rows), *e.shape) for e, o in zip(self.param_entries, self.param_offsets)
        ]

    @contextmanager
    def without_gradients(self, names: list[str]) -> Iterator[None]:
        """Within: the named parameter tensors are passed as constants, not differentiated, and the optimizer skips
        them (`FlatModel.without_gradients`' twin): no backward pass through them, no step."""
        frozen = set(names)
        self._frozen = {i for i, e in enumerate(self.param_entries) if e.name in frozen}
        self._differentiated = [n for i, n in enumerate(self._names) if i not in self._frozen]
        try:
            yield
        finally:
            self._frozen, self._differentiated = set(), self._names

    def _stepped(self, tensors: list[Tensor]) -> list[Tensor]:
        """The per-parameter-tensor list without the frozen tensors (`without_gradients`): the optimizer skips them,
        as torch's optimizers skip a parameter whose gradient is None (no step, no weight decay, no momentum)."""
        if not self._frozen:
            return tensors
        return [t for i, t in enumerate(tensors) if i not in self._frozen]

    def _grads(
        self,
        params: list[Tensor],
        buffers: dict[str, Tensor],
        x: Tensor,
        y: Tensor,
        step: int,
        weights: Tensor | None = None,
        inputs: Tensor | None = None,
    ) -> tuple[list[Tensor], Tensor, dict[str, Tensor]]:
        """(gradient of each parameter tensor, losses, logged values) of a range of rows, from the views of their
        parameters; `buffers` (one row per client) are updated in place. Differentiating with respect to one
        view per tensor is O(d); differentiating slices of one flat row would build a full-length zero gradient
        per tensor and add them all up. `weights` (rows, batch): per-sample weights of a weighted loss; `inputs`
        (rows, ...): each row's inputs of the algorithm's objective, when one is set. Frozen tensors
        (`without_gradients`) go in beside the buffers and get a zero gradient."""
        if self._frozen:
            buffers = {**buffers, **{self._names[i]: params[i] for i in self._frozen}}
        differentiated = tuple(_per_row_channels_last(p) for i, p in enumerate(params) if i not in self._frozen)
        if self.channels_last_inputs:
            x = _batches_channels_last(x)
        if self.step_module.objective is not None:
            inputs = x.new_zeros(len(x), 0) if inputs is None else inputs
            grads, (losses, logged) = self._objective_grad_and_loss(differentiated, buffers, x, y, step, inputs)
        elif weights is None:
            grads, (losses, logged) = self._grad_and_loss(differentiated, buffers, x, y, step)
        else:
            grads, (losses, logged) = self._weighted_grad_and_loss(differentiated, buffers, x, y, step, weights)
        if self._frozen:
            given = iter(grads)
            grads = [torch.zeros_like(p) if i in self._frozen else next(given) for i, p in enumerate(params)]
        return list(grads), losses, logged

    def loss_and_grads(self, params: Tensor, x: Tensor, y: Tensor, step: int = 0) -> tuple[Tensor, Tensor]:
        """(losses (k,), flat gradients (k, d)) of the module's `training_step` at k flat models on their own
        batches (x: (k, batch, ...), y: (k, batch), converted as the module sees them), in training mode and the
        run's precision: one step of a custom local loop for a group of clients at once (`loss_and_grad` of the
        sequential trainer, per client). Buffers are read from the rows and not updated; their gradient is 0. When
        the rows hold parameters only, the gradients' concatenation is returned as it is (no zeroed (k, d) matrix
        to copy it into)."""
        k = len(params)
        # a fresh copy of the rows, even of parameters alone: BLAS's results may depend on where the rows start
        views = self._tensor_views(params[:, self.param_mask].contiguous(), range(0, k))
        self.step_module.train()
        with (
            StepLogs(self.module) as step_logs,
            batch_norm_in_its_own_dtype(self.module),
            self._pooling(),
            self.fabric.autocast(),
        ):
            self.step_module.logs = step_logs
            grads, losses, _ = self._grads(views, self._buffers(params), x, y, step)
            self.step_module.logs = None
        del views
        gradient = torch.cat([g.reshape(k, -1) for g in grads], dim=1).to(params.dtype)
        if not self.buffer_entries:  # the rows are the parameters: the gradient is every entry's
            return losses.detach().float(), gradient
        flat = torch.zeros_like(params)
        flat[:, self.param_mask] = gradient
        return losses.detach().float(), flat

    def fit_many(
        self,
        starts: Tensor,
        data: list[tuple[Tensor, Tensor]],
        seeds: list[int],
        hook: GroupHook | None = None,
        lr_scale: float = 1.0,
        round: int = 1,
        epochs: int | None = None,
        sample_weights: list[Tensor] | None = None,
        client_inputs: Tensor | None = None,
    ) -> Trained:
        """Train each row of `starts` on its (x, y) with its seed for `epochs` (default: the configured local
        epochs) at the learning rates of round `round` times `lr_scale`: the trained flat models, the mean loss of
        each client's last epoch and each client's logged values, as `ClientTrainer.fit` gives for each client
        alone. Batch orders come from the clients' seeds, as sequentially; random layers
        (dropout) draw from one stream seeded by all of them, so their masks differ from sequential training's
        but repeat exactly, resumed runs included. `client_inputs` ((clients, ...)): each client's row handed to
        the objective set on the step (`LocalWork.objective`).

        The clients are trained largest first (rows sorted by size), so at every step the clients still training
        are the first rows, and those with a short last batch come last: each step works on contiguous ranges of
        rows, through views, instead of gathering and scattering rows."""
        epochs = self.local_epochs if epochs is None else epochs
        seed_random_layers(int(np.random.SeedSequence(seeds).generate_state(1)[0]), starts.device)
        group = self._sorted_group(starts, data, seeds, hook, sample_weights, client_inputs)
        rates = [r[0] * lr_scale for r in self.learning_rates.rates(round, epochs * max(group.steps))]
        self.step_module.train()
        with StepLogs(self.module) as step_logs, batch_norm_in_its_own_dtype(self.module), self._pooling():
            self.step_module.logs = step_logs
            for epoch in range(epochs):
                self._train_epoch(group, rates, round, epoch)
            self.step_module.logs = None
        return self._results_in_given_order(group)

    def _pooling(self) -> AbstractContextManager:
        """In the channels-last layout, the clients' max-pooling as one pooling over their channels: the grouped
        convolutions' outputs are (batch, clients x channels, h, w) channels-last, which vmap's own rule for pooling
        copies into (clients x batch, ...) NCHW, slow to pool (`fedlight.training.client_pooling`)."""
        return clients_in_channels() if self.channels_last_inputs else nullcontext()

    def _sorted_group(
        self,
        starts: Tensor,
        data: list[tuple[Tensor, Tensor]],
        seeds: list[int],
        hook: GroupHook | None,
        sample_weights: list[Tensor] | None,
        client_inputs: Tensor | None,
    ) -> _SortedGroup:
        """`fit_many`'s clients sorted by size, largest first, ready to train: their data concatenated, their
        parameters as one contiguous matrix, their buffers and the optimizer's state."""
        device = starts.device
        clients = len(starts)
        order = sorted(range(clients), key=lambda r: -len(data[r][1]))  # stable: ties keep their order
        # every row one model (expanded, stride 0) needs no sorting and no copy, unless a hook is handed the starts
        sorted_starts = starts if hook is None and starts.stride(0) == 0 else starts[order]
        data, seeds = [data[r] for r in order], [seeds[r] for r in order]
        params = (
            sorted_starts.clone(memory_format=torch.contiguous_format)
            if not self.buffer_entries
            else sorted_starts[:, self.param_mask]
        )  # (boolean indexing copies)
        sizes = [len(y) for _, y in data]
        return _SortedGroup(
            order=order,
            starts=sorted_starts,
            hook=hook,
            weights=None if sample_weights is None else torch.cat([sample_weights[r] for r in order]),
            inputs=None if client_inputs is None else client_inputs[order],
            params=params,
            buffers=self._buffers(sorted_starts),
            state=self.optimizer.init_state(params),
            sizes=sizes,
            steps=[math.ceil(n / self.batch_size) for n in sizes],
            generators=[torch.Generator().manual_seed(seed) for seed in seeds],
            x=torch.cat([x for x, _ in data]),
            y=torch.cat([y for _, y in data]),
            offsets=torch.tensor([0] + sizes[:-1], device=device).cumsum(0),
            loss_sum=torch.zeros(clients, device=device),
            logs=LogSums(clients, device),
        )

    def _train_epoch(self, group: _SortedGroup, rates: list[float], round: int, epoch: int) -> None:
        """One local epoch of every client of `group`: each client's batch order drawn from its own generator, then
        step by step the ranges of rows still training. The loss and log sums start again from zero (the values
        kept are the last epoch's)."""
        group.orders = [sample_order(n, g, group.device) for n, g in zip(group.sizes, group.generators)]
        group.loss_sum.zero_()
        group.logs.clear()
        for step in range(max(group.steps)):
            self.stand_in.at(round, epoch, step)
            for rows, count in self._ranges(step, group.sizes, group.steps):
                self._train_rows(group, rates, epoch, step, rows, count)

    def _train_rows(
        self, group: _SortedGroup, rates: list[float], epoch: int, step: int, rows: range, count: int
    ) -> None:
        """One step of the rows `rows`, each on its next `count` samples: their gradients (`_row_gradients`), the
        hook's correction, the optimizer's step on their parameters, and their losses and logged values summed."""
        param_views, grads, losses, logged = self._row_gradients(group, step, rows, count)
        if group.hook is not None:
            grads = self._apply_hook(group.hook, group.order, rows, group.params, grads, group.starts)
        lr = self._rate(rates, rows, group.steps, epoch, step, group.device)
        self.optimizer.step(
            self._stepped(param_views),
            self._stepped(grads),
            group.state,
            lambda m: self._stepped(self._tensor_views(m, rows)),
            rows,
            lr,
        )
        group.loss_sum[rows.start : rows.stop] += losses.detach().float()
        group.logs.add(logged, slice(rows.start, rows.stop), count)

    def _row_gradients(
        self, group: _SortedGroup, step: int, rows: range, count: int
    ) -> tuple[list[Tensor], list[Tensor], Tensor, dict[str, Tensor]]:
        """(views of the rows' parameter tensors, their gradients in the parameters' dtype, losses, logged values)
        of the rows `rows` on their batches of this step; their buffers in `group` are updated."""
        b = self.batch_size
        index = torch.stack([group.orders[r][step * b : step * b + count] for r in rows])
        index = index + group.offsets[rows.start : rows.stop, None]
        x, y = self._transform(group.x[index], group.y[index])
        whole = len(rows) == group.clients  # BatchNorm's in-place update reaches whole tensors only
        buffers = group.buffers if whole else {k: v[rows.start : rows.stop].clone() for k, v in group.buffers.items()}
        param_views = self._tensor_views(group.params, rows)
        weights = None if group.weights is None else group.weights[index]
        inputs = None if group.inputs is None else group.inputs[rows.start : rows.stop]
        with self.fabric.autocast():
            grads, losses, logged = self._grads(param_views, buffers, x, y, step, weights, inputs)
        if not whole:
            for name, value in buffers.items():
                group.buffers[name][rows.start : rows.stop] = value
        return param_views, [g.to(group.params.dtype) for g in grads], losses, logged

    def _results_in_given_order(self, group: _SortedGroup) -> Trained:
        """The trained flat models (the parameters, and the buffers written into copies of the starts), each
        client's mean loss over its last epoch's steps and its logged values, in the clients' order as given to
        `fit_many`. It spends `group`: the optimizer's rows go before the trained models are put together, the
        trained rows once they are."""
        clients, device = group.clients, group.device
        del group.state  # the optimizer's rows go before the trained models are put together
        if not self.buffer_entries:
            trained = group.params
        else:
            trained = group.starts.clone()
            trained[:, self.param_mask] = group.params
            for e in self.buffer_entries:
                trained[:, e.start : e.stop] = group.buffers[f"inner.{e.name}"].reshape(clients, -1)
        del group.params, group.buffers
        back = torch.tensor(group.order, device=device).argsort()  # the clients' order as given
        in_order = group.order == list(range(clients))
        return Trained(
            trained if in_order else trained[back],
            (group.loss_sum / torch.tensor(group.steps, device=device))[back],
            {name: values[back] for name, values in group.logs.means().items()},
        )

    def _rate(
        self, rates: list[float], rows: range, steps: list[int], epoch: int, step: int, device: torch.device
    ) -> float | Tensor:
        """The learning rate of this step: one number, or one per row when a scheduler steps by local step (a
        client's step count then depends on its own number of steps per epoch)."""
        if not self.learning_rates.by_step:  # epoch schedulers move between rounds only
            return rates[0]
        return torch.tensor([rates[epoch * steps[r] + step] for r in rows], device=device)

    def _ranges(self, step: int, sizes: list[int], steps: list[int]) -> list[tuple[range, int]]:
        """The rows training at `step` (a prefix, the rows being sorted by size), cut into contiguous ranges of
        equal batch size: full batches first, then the short last batches, largest first."""
        ranges: list[tuple[range, int]] = []
        for row, (n, s) in enumerate(zip(sizes, steps)):
            if step >= s:
                break
            count = min(self.batch_size, n - step * self.batch_size)
            if ranges and ranges[-1][1] == count:
                ranges[-1] = (range(ranges[-1][0].start, row + 1), count)
            else:
                ranges.append((range(row, row + 1), count))
        return ranges

    def _transform(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The data module's per-batch conversion, on the (clients * batch) rows, reshaped back."""
        c, n = y.shape[:2]  # a label may be more than a number (a language model's labels per token)
        flat_x, flat_y = self.batch_transform((x.reshape(c * n, *x.shape[2:]), y.reshape(c * n, *y.shape[2:])), 0)
        return flat_x.reshape(c, n, *flat_x.shape[1:]), flat_y.reshape(c, n, *flat_y.shape[1:])

    def _apply_hook(
        self, hook: GroupHook, order: list[int], rows: range, params: Tensor, grads: list[Tensor], starts: Tensor
    ) -> list[Tensor]:
        """Run the gradient correction on the full-length flat rows (buffers included) of a range of rows at once;
        the hook is told the clients' positions as given to `fit_many` (`order` maps sorted rows back). When the
        flat rows hold parameters only (no buffers), the rows are `params` themselves: the hook sees views of them
        and of the starts and one concatenated gradient, with no full-length copies (a quarter of Ditto's
        training time went into them)."""
        mask = self.param_mask
        k = len(rows)
        positions = [order[row] for row in rows]
        if not self.buffer_entries:
            flat_grad = torch.cat([g.reshape(k, -1) for g in grads], dim=1)
            hook(positions, params[rows.start : rows.stop], flat_grad, starts[rows.start : rows.stop])
            return self._tensor_views(flat_grad, range(0, k))
        full = starts[rows.start : rows.stop].clone()
        full[:, mask] = params[rows.start : rows.stop]
        scratch = torch.zeros_like(full)
        scratch[:, mask] = torch.cat([g.reshape(k, -1) for g in grads], dim=1).to(scratch.dtype)
        hook(positions, full, scratch, starts[rows.start : rows.stop])
        return self._tensor_views(scratch[:, mask].contiguous(), range(0, k))
