"""Evaluation's convolutions on a CPU in channels-last layout: oneDNN's convolutions and max-pooling run 1.1-1.9x
faster on NHWC tensors than on NCHW ones (docs/results.md, "evaluation at scale"), and the layout a convolution's
weight has decides the layout of its output and of what follows it. The module's own weights are views into the flat
model (`fedlight.training.flat`), laid out NCHW, so the layout is changed on copies, for one forward pass at a time,
and the views are put back after: training, aggregation and the flat vector never see it. Outputs equal the NCHW
ones up to float rounding (the same sums in another order)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def channels_last_on_cpu(module: nn.Module) -> Iterator[None]:
    """Within the block, every 4-D parameter of `module` on a CPU (a 2-D convolution's weight) is a channels-last
    copy; outside it, the module's own tensors. Use under `torch.no_grad()`: the copies carry no gradient."""
    swapped = [
        (parameter, parameter.data)
        for parameter in module.parameters()
        if parameter.dim() == 4 and parameter.device.type == "cpu"
    ]
    for parameter, own in swapped:
        # a copy with channels-last strides even where the NCHW ones pass for channels-last: a first convolution of
        # one input channel, whose weight `.contiguous(memory_format=...)` would return as it is, then gives NCHW
        # outputs and the max-pooling after it runs 10x slower (`tests/unit/test_channels_last.py`)
        parameter.data = torch.empty_like(own, memory_format=torch.channels_last).copy_(own)
    try:
        yield
    finally:
        for parameter, own in swapped:
            parameter.data = own
