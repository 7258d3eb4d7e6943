"""A classification LightningModule wrapping any network: cross-entropy, optimizer from config."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Classifier(L.LightningModule):
    """Trains `network` with cross-entropy. fedlight calls its `training_step` and `configure_optimizers`
    for every client, exactly as a Trainer would.

    Args:
        network: the torch module mapping inputs to class logits.
        optimizer: "sgd", "adam" or "adamw".
        lr: learning rate.
        momentum: SGD momentum (ignored by Adam).
        weight_decay: L2 penalty.
    """

    def __init__(
        self,
        network: nn.Module,
        optimizer: Literal["sgd", "adam", "adamw"] = "sgd",
        lr: float = 0.05,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        self.network = network
        self.optimizer_name = optimizer
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay

    def forward(self, x: Tensor) -> Tensor:
        return self.network(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return build_optimizer(self.optimizer_name, self.parameters(), self.lr, self.momentum, self.weight_decay)


def build_optimizer(
    name: str, params: Iterable[Tensor], lr: float, momentum: float, weight_decay: float
) -> torch.optim.Optimizer:
    """The optimizer a classifier's config names: "sgd" (with `momentum`), "adam" or "adamw"."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; use 'sgd', 'adam' or 'adamw'")
