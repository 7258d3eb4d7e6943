"""Learning rates a scheduler gives on its own, to compare a federation's with."""

from __future__ import annotations

import torch


def one_cycle_rates(steps: int, max_lr: float = 0.5) -> list[float]:
    """The learning rate of each of `steps` steps of a fresh OneCycleLR over `steps` steps, read off a standalone
    optimizer that the scheduler steps alone."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=max_lr, total_steps=steps)
    rates = []
    for step in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        if step < steps - 1:
            optimizer.step()
            cycle.step()
    return rates
