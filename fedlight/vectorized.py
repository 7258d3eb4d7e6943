"""Vectorized client training: the clients of a round train together as one batched computation.

FL simulators are slow because they train hundreds of tiny models one after another. Here the clients'
parameters are stacked into one (clients, parameters) matrix and the module's own `training_step` is run
through `torch.func.vmap(grad_and_value(...))` over the client dimension, so one step of C clients is one
set of kernel launches. Each client takes exactly the batches it would take alone: the same per-client
permutation stream as the sequential trainer, and a step where some clients have a shorter (last) batch or
none left is run as separate groups of equal batch size. The results equal sequential training's up to float
rounding, with one caveat: where max pooling meets exactly equal activations, the batched kernel may route the
gradient to another of the tied positions (an equally valid subgradient). The optimizer is applied functionally to the stacked
rows with the hyper-parameters of the module's own optimizer (SGD with momentum/Nesterov/weight decay, Adam,
AdamW), at the learning rates of its schedulers (`fedlight.schedules`). Buffers are per client too: BatchNorm's
running statistics are a (clients, ...) tensor each, updated in place by the vmapped step as each client's own
would be. What `training_step` logs comes back beside the loss, one value per client (`fedlight.step_logs`).
Modules that cannot be vectorized (other optimizers, several parameter groups, a gradient scaler, cumulative
BatchNorm averages) are reported by `unsupported_reason` and trained sequentially.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import lightning as L
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.modules.batchnorm import _BatchNorm

from fedlight.flat import FlatModel
from fedlight.schedules import LearningRates
from fedlight.step_logs import LogSums, StepLogs
from fedlight.worker import training_loss

RowHook = Callable[[int, Tensor, Tensor, Tensor], None]  # (row, params, grad, start) of one client


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
    """Makes `training_step` the forward of a module, so `functional_call` can run it with given weights; returns
    (loss, what the step logged)."""

    def __init__(self, inner: L.LightningModule) -> None:
        super().__init__()
        self.inner = inner
        self.logs: StepLogs | None = None

    def forward(self, batch, batch_idx: int) -> tuple[Tensor, dict[str, Tensor]]:
        loss = training_loss(self.inner.training_step(batch, batch_idx))
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
    """torch.optim's SGD / Adam / AdamW update rules on stacked rows (one row per client).

    The update is done in place: on the stored rows themselves when a step involves every client (the common
    case), otherwise on gathered copies that are scattered back. Which rows have a momentum buffer is known on
    the host, so no step reads a value back from the device."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.kind = type(optimizer).__name__
        self.h = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}

    def init_state(self, params: Tensor) -> dict[str, Any]:
        zeros = torch.zeros_like(params)
        if self.kind == "SGD":
            return {"momentum": zeros, "started": [False] * len(params)}
        return {"m": zeros, "v": zeros.clone(), "t": torch.zeros(len(params), dtype=params.dtype, device=params.device)}

    def step(self, params: Tensor, grads: Tensor, state: dict[str, Any], row_ids: list[int],
             lr: float | Tensor) -> None:
        """Update `params[row_ids]` in place from `grads` (one row per entry of `row_ids`, which are distinct and
        ascending; `grads` is consumed) at learning rate `lr` (one for all rows, or one per row). Row ids come as a
        host list, so the step never syncs with the device."""
        every = len(row_ids) == len(params)  # distinct and ascending: all rows, in order
        rows = None if every else torch.tensor(row_ids, device=params.device)

        def take(stored: Tensor) -> Tensor:
            return stored if every else stored[rows]

        def put(stored: Tensor, value: Tensor) -> None:
            if not every:
                stored[rows] = value

        h, p, g = self.h, take(params), grads
        if self.kind == "SGD":
            if h["weight_decay"]:
                g.add_(p, alpha=h["weight_decay"])
            if h["momentum"]:
                buf = take(state["momentum"])
                g = self._momentum(g, buf, state["started"], row_ids)
                put(state["momentum"], buf)
            p.sub_(g, alpha=lr) if isinstance(lr, float) else p.sub_(g * lr[:, None])
            put(params, p)
            return
        lr = lr if isinstance(lr, float) else lr[:, None]
        beta1, beta2 = h["betas"]
        if self.kind == "AdamW" or h.get("decoupled_weight_decay", False):
            p.mul_(1 - lr * h["weight_decay"])
        elif h["weight_decay"]:
            g.add_(p, alpha=h["weight_decay"])
        m, v, t = take(state["m"]), take(state["v"]), take(state["t"])
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        t.add_(1)
        put(state["m"], m), put(state["v"], v), put(state["t"], t)
        bias1, bias2 = (1 - beta1**t)[:, None], (1 - beta2**t)[:, None]
        p.sub_((lr / bias1) * m / (v.sqrt() / bias2.sqrt() + h["eps"]))
        put(params, p)

    def _momentum(self, g: Tensor, buf: Tensor, started: list[bool], rows: list[int]) -> Tensor:
        """SGD's momentum buffer update (the buffer starts as the first gradient); returns the step direction.
        `buf` is updated in place; with Nesterov the direction is g + momentum * buf."""
        h = self.h
        first = [not started[r] for r in rows]
        if all(first):
            buf.copy_(g)
        elif not any(first):
            buf.mul_(h["momentum"]).add_(g, alpha=1 - h["dampening"])
        else:
            fresh = torch.tensor(first, device=g.device)[:, None]
            buf.copy_(torch.where(fresh, g, h["momentum"] * buf + (1 - h["dampening"]) * g))
        for r in rows:
            started[r] = True
        return g.add_(buf, alpha=h["momentum"]) if h["nesterov"] else buf


class VectorizedTrainer:
    """Trains several clients at once from their flat starting models on the shared module's structure."""

    def __init__(self, fabric: L.Fabric, module: L.LightningModule, flat: FlatModel, optimizer: torch.optim.Optimizer,
                 learning_rates: LearningRates, batch_transform: Callable, batch_size: int, local_epochs: int) -> None:
        self.fabric, self.flat, self.module = fabric, flat, module
        self.batch_transform, self.batch_size, self.local_epochs = batch_transform, batch_size, local_epochs
        self.optimizer = FunctionalOptimizer(optimizer)
        self.learning_rates = learning_rates
        self.step_module = _TrainingStep(module)
        self.param_mask = flat.parameter_mask()
        self.param_entries = [e for e in flat.entries if e.is_parameter]
        self.buffer_entries = [e for e in flat.entries if not e.is_parameter]
        self.param_offsets = self._offsets(self.param_entries)
        self._names = [f"inner.{e.name}" for e in self.param_entries]
        flat_buffers = {e.name for e in self.buffer_entries}
        self._other_buffers = {f"inner.{name}": b for name, b in module.named_buffers() if name not in flat_buffers}
        self._grad_and_loss = vmap(grad_and_value(self._loss, has_aux=True), in_dims=(0, 0, 0, 0, None),
                                   randomness="different")
        self.last_logs: dict[str, Tensor] = {}

    @staticmethod
    def _offsets(entries) -> list[int]:
        offsets, offset = [], 0
        for e in entries:
            offsets.append(offset)
            offset += e.numel
        return offsets

    def _loss(self, tensors: tuple[Tensor, ...], buffers: dict[str, Tensor], x: Tensor, y: Tensor,
              batch_idx: int) -> tuple[Tensor, dict[str, Tensor]]:
        return functional_call(self.step_module, {**dict(zip(self._names, tensors)), **buffers}, ((x, y), batch_idx))

    def _buffers(self, starts: Tensor) -> dict[str, Tensor]:
        """Every client's buffers as one (clients, ...) tensor each: the federated ones from the flat rows, the
        others (BatchNorm's batch counter) as per-client copies of the module's. Each must be a tensor of its
        own, not a view: under vmap, BatchNorm's in-place update of a view does not reach the viewed tensor."""
        flat = {f"inner.{e.name}": starts[:, e.start: e.stop].reshape(len(starts), *e.shape).clone()
                for e in self.buffer_entries}
        others = {name: b.expand(len(starts), *b.shape).clone() for name, b in self._other_buffers.items()}
        return {**flat, **others}

    def _grads(self, params: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor,
               step: int) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(stacked flat gradients, losses, logged values) of the rows of `params`; `buffers` (one row per client)
        are updated in place. Differentiating with respect to one view per parameter tensor and concatenating
        once is O(d); differentiating slices of one flat row would build a full-length zero gradient per tensor
        and add them all up."""
        views = tuple(params[:, o: o + e.numel].view(len(params), *e.shape)
                      for e, o in zip(self.param_entries, self.param_offsets))
        grads, (losses, logged) = self._grad_and_loss(views, buffers, x, y, step)
        return torch.cat([g.reshape(len(params), -1) for g in grads], dim=1), losses, logged

    def fit_many(self, starts: Tensor, data: list[tuple[Tensor, Tensor]], seeds: list[int],
                 row_hook: RowHook | None = None, lr_scale: float = 1.0, round: int = 1) -> tuple[Tensor, Tensor]:
        """Train each row of `starts` on its (x, y) with its seed at the learning rates of round `round` times
        `lr_scale`; return (trained flat models, mean loss of each client's last epoch), exactly as
        `ClientTrainer.fit` would for each client alone, and keep each client's logged values in `last_logs`."""
        device = starts.device
        clients = len(starts)
        params = starts[:, self.param_mask].clone()
        buffers = self._buffers(starts)
        state = self.optimizer.init_state(params)
        b = self.batch_size
        sizes = [len(y) for _, y in data]
        steps = [math.ceil(n / b) for n in sizes]
        rates = [r[0] * lr_scale for r in self.learning_rates.rates(round, self.local_epochs * max(steps))]
        generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        x_all = torch.cat([x for x, _ in data])
        y_all = torch.cat([y for _, y in data])
        offsets = torch.tensor([0] + sizes[:-1], device=device).cumsum(0)
        loss_sum = torch.zeros(clients, device=device)
        logs = LogSums(clients, device)
        grad_rows = torch.zeros_like(starts) if row_hook is not None else None
        self.step_module.train()
        with StepLogs(self.module) as step_logs, batch_norm_in_its_own_dtype(self.module):
            self.step_module.logs = step_logs
            for epoch in range(self.local_epochs):
                orders = [torch.randperm(n, generator=g, device=device) for n, g in zip(sizes, generators)]
                loss_sum.zero_()
                logs.clear()
                for step in range(max(steps)):
                    for row_ids, rows, count in self._groups(step, sizes, steps):
                        every = len(row_ids) == clients
                        index = torch.stack([orders[r][step * b: step * b + count] for r in row_ids])
                        index = index + offsets[rows, None]
                        x, y = self._transform(x_all[index], y_all[index])
                        group_buffers = buffers if every else {k: v[rows] for k, v in buffers.items()}
                        with self.fabric.autocast():
                            grads, losses, logged = self._grads(params[rows], group_buffers, x, y, step)
                        if not every:
                            for name, value in group_buffers.items():
                                buffers[name][rows] = value
                        if row_hook is not None:
                            grads = self._apply_hook(row_hook, row_ids, rows, params, grads, starts, grad_rows)
                        lr = self._rate(rates, row_ids, steps, epoch, step, device)
                        self.optimizer.step(params, grads.to(params.dtype), state, row_ids, lr)
                        loss_sum[rows] += losses.detach().float()
                        logs.add(logged, rows, count)
            self.step_module.logs = None
        trained = starts.clone()
        trained[:, self.param_mask] = params
        for e in self.buffer_entries:
            trained[:, e.start: e.stop] = buffers[f"inner.{e.name}"].reshape(clients, -1)
        self.last_logs = logs.means()
        return trained, loss_sum / torch.tensor(steps, device=device)

    def _rate(self, rates: list[float], row_ids: list[int], steps: list[int], epoch: int, step: int,
              device: torch.device) -> float | Tensor:
        """The learning rate of this step: one number, or one per row when a scheduler steps by local step (a
        client's step count then depends on its own number of steps per epoch)."""
        if not self.learning_rates.by_step:  # epoch schedulers move between rounds only
            return rates[0]
        return torch.tensor([rates[epoch * steps[r] + step] for r in row_ids], device=device)

    def _groups(self, step: int, sizes: list[int], steps: list[int]) -> list[tuple[list[int], Tensor, int]]:
        """Clients active at `step`, grouped by their batch size there (full batches, then short last ones), as
        (ascending row ids, the same on the device, batch size)."""
        by_count: dict[int, list[int]] = {}
        for row, (n, s) in enumerate(zip(sizes, steps)):
            if step < s:
                by_count.setdefault(min(self.batch_size, n - step * self.batch_size), []).append(row)
        device = self.param_mask.device
        return [(rows, torch.tensor(rows, device=device), count) for count, rows in by_count.items()]

    def _transform(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The data module's per-batch conversion, on the (clients * batch) rows, reshaped back."""
        c, n = y.shape
        flat_x, flat_y = self.batch_transform((x.reshape(c * n, *x.shape[2:]), y.reshape(c * n)), 0)
        return flat_x.reshape(c, n, *flat_x.shape[1:]), flat_y.reshape(c, n)

    def _apply_hook(self, hook: RowHook, row_ids: list[int], rows: Tensor, params: Tensor, grads: Tensor,
                    starts: Tensor, scratch: Tensor) -> Tensor:
        """Run the algorithm's per-client gradient correction on full-length flat rows (buffers included)."""
        mask = self.param_mask
        for i, row in enumerate(row_ids):
            full_params = starts[row].clone()
            full_params[mask] = params[row]
            scratch[row].zero_()
            scratch[row, mask] = grads[i].to(scratch.dtype)
            hook(row, full_params, scratch[row], starts[row])
        return scratch[rows][:, mask]
