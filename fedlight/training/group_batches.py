"""The batches of a group of clients, step by step, for custom local loops that run the clients together.

A custom local loop (APFL, pFedMe, Per-FedAvg) takes, per client, the batches the module's SGD would take
(`ClientTrainer.batch_rows`: a permutation per epoch from the client's seed). Run for a group at once, every step
gathers the batch of each client still training, stacked as (clients, batch, ...); clients whose batch is shorter
(their last one) come in a step of their own, so every stacked batch has one size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedlight.training.sequential import sample_order, seed_random_layers


@dataclass
class GroupStep:
    """One step of a group's local loop: the clients at positions `rows` (of the group as given) each take their
    batch of local step `step` in epoch `epoch`; `batch` is (x, y) stacked, (len(rows), batch size, ...), converted
    as the module sees them."""

    epoch: int
    step: int
    rows: list[int]
    batch: tuple[Tensor, Tensor]


def group_steps(
    data: list[tuple[Tensor, Tensor]],
    seeds: list[int],
    batch_size: int,
    epochs: int,
    transform: Callable[[Any, int], Any],
    device: torch.device,
    limits: list[int | None] | None = None,
) -> Iterator[GroupStep]:
    """The `GroupStep`s of `epochs` local epochs of clients with training data `data` and seeds `seeds`: client r
    takes exactly the batches `ClientTrainer.batch_rows(len(data[r][1]), seeds[r], epochs)` gives it alone, its first
    `limits[r]` of them when that is not None (partial work, `fedlight.training.work_shares`). Random layers
    (dropout) draw from one stream seeded by all the seeds, as the vectorized trainer's do (by the client's own seed
    when it is alone, as `batch_rows` seeds them)."""
    one = seeds[0] if len(seeds) == 1 else int(np.random.SeedSequence(seeds).generate_state(1)[0])
    seed_random_layers(one, device)  # one client alone draws what `batch_rows` draws
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    sizes = [len(y) for _, y in data]
    steps = [math.ceil(n / batch_size) for n in sizes]
    for epoch in range(epochs):
        orders = [sample_order(n, g, device) for n, g in zip(sizes, generators)]
        for step in range(max(steps, default=0)):
            by_count: dict[int, list[int]] = {}
            for row, n in enumerate(sizes):
                limit = None if limits is None else limits[row]
                if step < steps[row] and (limit is None or epoch * steps[row] + step < limit):
                    by_count.setdefault(min(batch_size, n - step * batch_size), []).append(row)
            for count in sorted(by_count, reverse=True):
                rows = by_count[count]
                picks = [orders[r][step * batch_size : step * batch_size + count] for r in rows]
                x = torch.stack([data[r][0][p] for r, p in zip(rows, picks)])
                y = torch.stack([data[r][1][p] for r, p in zip(rows, picks)])
                flat_x, flat_y = transform((x.reshape(-1, *x.shape[2:]), y.reshape(-1)), 0)
                yield GroupStep(
                    epoch,
                    step,
                    rows,
                    (flat_x.reshape(len(rows), count, *flat_x.shape[1:]), flat_y.reshape(len(rows), count)),
                )
