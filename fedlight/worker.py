"""Local training of one client at a time on ONE reused LightningModule (docs/architecture.md, "Speed").

The module's own `training_step` and `configure_optimizers` are used, so a user's LightningModule works
unchanged. Its optimizer is built once; between clients its state is cleared and its hyper-parameters
restored, which is the same as building a fresh one. Batches are gathered from the client's slice of the
split tensor on the device; no DataLoader is involved.
"""
from __future__ import annotations

import copy
import warnings
from typing import Callable

import lightning as L
import torch
from torch import Tensor

from fedlight.flat import FlatModel

GradientHook = Callable[[Tensor, Tensor, Tensor], None]

warnings.filterwarnings("ignore", message=r".*self\.log\(\)` but the `self\.trainer` reference is not registered.*")


def first_optimizer(configured) -> torch.optim.Optimizer:
    """The optimizer out of whatever `configure_optimizers` returned (optimizer, list, tuple or dict)."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, dict):
        return first_optimizer(configured["optimizer"])
    if isinstance(configured, (list, tuple)) and configured:
        return first_optimizer(configured[0])
    raise TypeError("configure_optimizers() must return an optimizer (or a list/dict holding one); "
                    f"got {type(configured).__name__}")


def training_loss(output) -> Tensor:
    """The loss out of what `training_step` returned (a tensor or a dict with 'loss')."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, dict) and "loss" in output:
        return output["loss"]
    raise TypeError("training_step must return the loss tensor or a dict with a 'loss' key")


class ClientTrainer:
    """Trains the shared module from a given flat model on one client's data and returns the result."""

    def __init__(self, fabric: L.Fabric, module: L.LightningModule, flat: FlatModel,
                 batch_transform: Callable, batch_size: int, local_epochs: int) -> None:
        self.fabric = fabric
        self.module = module
        self.flat = flat
        self.batch_transform = batch_transform
        self.batch_size = batch_size
        self.local_epochs = local_epochs
        raw = first_optimizer(module.configure_optimizers())
        self.optimizer = fabric.setup_optimizers(raw)
        self.raw_optimizer = raw
        self.initial_groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in raw.param_groups]
        self.scaler = getattr(fabric.strategy.precision, "scaler", None)

    def reset_optimizer(self) -> None:
        """Forget momentum/Adam statistics and restore the configured hyper-parameters."""
        self.raw_optimizer.state.clear()
        for group, initial in zip(self.raw_optimizer.param_groups, self.initial_groups):
            group.update(initial)

    def set_learning_rate_scale(self, scale: float) -> None:
        """Scale every group's learning rate relative to the configured one (for server-side schedules)."""
        for group, initial in zip(self.raw_optimizer.param_groups, self.initial_groups):
            group["lr"] = initial["lr"] * scale

    def fit(self, start: Tensor, x: Tensor, y: Tensor, seed: int, gradient_hook: GradientHook | None = None,
            lr_scale: float = 1.0, epochs: int | None = None) -> tuple[Tensor, Tensor]:
        """Train from `start` on (x, y) for `epochs` (default: the configured local epochs); return (trained
        flat model, mean loss of the last epoch). All randomness (batch order, dropout) derives from `seed`."""
        module, flat = self.module, self.flat
        flat.load(start)
        flat.zero_grad()
        self.reset_optimizer()
        if lr_scale != 1.0:
            self.set_learning_rate_scale(lr_scale)
        module.train()
        torch.manual_seed(seed)
        generator = torch.Generator(device=x.device).manual_seed(seed)
        n, b = len(y), self.batch_size
        loss_sum = torch.zeros((), device=x.device)
        for _ in range(self.local_epochs if epochs is None else epochs):
            order = torch.randperm(n, generator=generator, device=x.device)
            loss_sum.zero_()
            for step, begin in enumerate(range(0, n, b)):
                rows = order[begin: begin + b]
                batch = self.batch_transform((x[rows], y[rows]), 0)
                with self.fabric.autocast():
                    loss = training_loss(module.training_step(batch, step))
                self.fabric.backward(loss)
                if gradient_hook is not None:
                    if self.scaler is not None:
                        self.scaler.unscale_(self.raw_optimizer)
                    gradient_hook(flat.vector, flat.grad, start)
                self.optimizer.step()
                flat.zero_grad()
                loss_sum += loss.detach().float()
        steps = -(-n // b)
        return flat.read(), loss_sum / steps
