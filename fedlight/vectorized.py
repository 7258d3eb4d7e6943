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
AdamW). Modules that cannot be vectorized (BatchNorm statistics in training mode, other optimizers, several
parameter groups, a gradient scaler) are reported by `unsupported_reason` and trained sequentially.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import lightning as L
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedlight.flat import FlatModel
from fedlight.worker import training_loss

RowHook = Callable[[int, Tensor, Tensor, Tensor], None]  # (row, params, grad, start) of one client


class _TrainingStep(nn.Module):
    """Makes `training_step` the forward of a module, so `functional_call` can run it with given weights."""

    def __init__(self, inner: L.LightningModule) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, batch, batch_idx: int) -> Tensor:
        return training_loss(self.inner.training_step(batch, batch_idx))


def unsupported_reason(module: nn.Module, optimizer: torch.optim.Optimizer, scaler) -> str | None:
    """Why this module/optimizer cannot be trained vectorized, or None when it can."""
    if not getattr(module, "automatic_optimization", True):
        return "the module uses manual optimization"
    for name, sub in module.named_modules():
        if getattr(sub, "track_running_stats", False) and getattr(sub, "running_mean", None) is not None:
            return f"{name} ({type(sub).__name__}) updates running statistics in training mode"
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

    def step(self, params: Tensor, grads: Tensor, state: dict[str, Any], row_ids: list[int], lr: float) -> None:
        """Update `params[row_ids]` in place from `grads` (one row per entry of `row_ids`, which are distinct and
        ascending; `grads` is consumed). Row ids come as a host list, so the step never syncs with the device."""
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
            p.sub_(g, alpha=lr)
            put(params, p)
            return
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
                 batch_transform: Callable, batch_size: int, local_epochs: int) -> None:
        self.fabric, self.flat = fabric, flat
        self.batch_transform, self.batch_size, self.local_epochs = batch_transform, batch_size, local_epochs
        self.optimizer = FunctionalOptimizer(optimizer)
        self.step_module = _TrainingStep(module)
        self.param_mask = flat.parameter_mask()
        self.param_entries = [e for e in flat.entries if e.is_parameter]
        self.buffer_entries = [e for e in flat.entries if not e.is_parameter]
        offsets, offset = [], 0
        for e in self.param_entries:
            offsets.append(offset)
            offset += e.numel
        self.param_offsets = offsets
        self._names = [f"inner.{e.name}" for e in self.param_entries]
        self._grad_and_loss = vmap(grad_and_value(self._loss), in_dims=(0, None, 0, 0, None), randomness="different")

    def _loss(self, tensors: tuple[Tensor, ...], buffers: dict[str, Tensor], x: Tensor, y: Tensor,
              batch_idx: int) -> Tensor:
        return functional_call(self.step_module, {**dict(zip(self._names, tensors)), **buffers}, ((x, y), batch_idx))

    def _grads(self, params: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor,
               step: int) -> tuple[Tensor, Tensor]:
        """(stacked flat gradients, losses) of the rows of `params`. Differentiating with respect to one view
        per parameter tensor and concatenating once is O(d); differentiating slices of one flat row would
        build a full-length zero gradient per tensor and add them all up."""
        views = tuple(params[:, o: o + e.numel].view(len(params), *e.shape)
                      for e, o in zip(self.param_entries, self.param_offsets))
        grads, losses = self._grad_and_loss(views, buffers, x, y, step)
        return torch.cat([g.reshape(len(params), -1) for g in grads], dim=1), losses

    def fit_many(self, starts: Tensor, data: list[tuple[Tensor, Tensor]], seeds: list[int],
                 row_hook: RowHook | None = None, lr_scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """Train each row of `starts` on its (x, y) with its seed; return (trained flat models, mean loss of
        each client's last epoch), exactly as `ClientTrainer.fit` would for each client alone."""
        device = starts.device
        clients = len(starts)
        params = starts[:, self.param_mask].clone()
        buffers = {f"inner.{e.name}": starts[0, e.start: e.stop].view(e.shape) for e in self.buffer_entries}
        state = self.optimizer.init_state(params)
        lr = self.optimizer.h["lr"] * lr_scale
        b = self.batch_size
        sizes = [len(y) for _, y in data]
        steps = [math.ceil(n / b) for n in sizes]
        generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        x_all = torch.cat([x for x, _ in data])
        y_all = torch.cat([y for _, y in data])
        offsets = torch.tensor([0] + sizes[:-1], device=device).cumsum(0)
        loss_sum = torch.zeros(clients, device=device)
        grad_rows = torch.zeros_like(starts) if row_hook is not None else None
        self.step_module.train()
        for _ in range(self.local_epochs):
            orders = [torch.randperm(n, generator=g, device=device) for n, g in zip(sizes, generators)]
            loss_sum.zero_()
            for step in range(max(steps)):
                for row_ids, rows, count in self._groups(step, sizes, steps):
                    index = torch.stack([orders[r][step * b: step * b + count] for r in row_ids])
                    index = index + offsets[rows, None]
                    x, y = self._transform(x_all[index], y_all[index])
                    with self.fabric.autocast():
                        grads, losses = self._grads(params[rows], buffers, x, y, step)
                    if row_hook is not None:
                        grads = self._apply_hook(row_hook, row_ids, rows, params, grads, starts, grad_rows)
                    self.optimizer.step(params, grads.to(params.dtype), state, row_ids, lr)
                    loss_sum[rows] += losses.detach().float()
        trained = starts.clone()
        trained[:, self.param_mask] = params
        return trained, loss_sum / torch.tensor(steps, device=device)

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
