"""Evaluation's rows a forward pass on a CPU, fitted to the network: the most rows whose largest activation stays
under 32 MiB, glibc's largest threshold for serving an allocation from memory it keeps. A larger activation is mapped
afresh at every pass and pays a page fault every 4 KB. Measured (docs/results.md, "eval_rows.py" and
"evaluation_scale.py"): LEAF's CNN (100 KB a row) evaluates its 3,400 writers 1.2x faster at 256 rows than at 128 and
runs 1.4x faster at 256 than at 512, while LeNet-5 and digits' SmallCNN (under 20 KB a row) run 1.1-1.3x faster at
512 than at 128. One row is run once per input shape to read the sizes."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

#: a pass's largest activation stays under glibc's largest threshold for serving an allocation from memory it keeps
#: (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit)
ACTIVATION_BUDGET_BYTES = 32 << 20
#: the most rows a CPU pass takes, whatever the network (larger gains nothing measurable: eval_rows.py)
CPU_MOST_ROWS = 512
#: the fewest: below this, per-pass overheads dominate
CPU_FEWEST_ROWS = 16


def _tensors(value: object) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def largest_activation_bytes(module: nn.Module, one_row: Tensor) -> int:
    """The bytes of the largest output any submodule of `module` gives on `one_row` (a batch of one), read by forward
    hooks over one pass. Call under `torch.no_grad()`."""
    largest = 0

    def record(_module: nn.Module, _inputs: object, output: object) -> None:
        nonlocal largest
        largest = max([largest, *(t.numel() * t.element_size() for t in _tensors(output))])

    handles = [m.register_forward_hook(record) for m in module.modules()]
    try:
        module(one_row)
    finally:
        for handle in handles:
            handle.remove()
    return largest


def rows_within_budget(row_bytes: int, most: int = CPU_MOST_ROWS, fewest: int = CPU_FEWEST_ROWS) -> int:
    """The most rows, halving from `most` down to `fewest` at least, whose activation of `row_bytes` a row stays under
    `ACTIVATION_BUDGET_BYTES`."""
    rows = most
    while rows > fewest and rows * row_bytes >= ACTIVATION_BUDGET_BYTES:
        rows //= 2
    return max(rows, fewest)


@torch.no_grad()
def cpu_eval_rows(module: nn.Module, one_row: Tensor) -> int:
    """Rows a CPU evaluation pass of `module` takes for inputs shaped like `one_row` (a batch of one)."""
    return rows_within_budget(largest_activation_bytes(module, one_row))
