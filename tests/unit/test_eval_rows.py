"""Evaluation's rows a forward pass on a CPU (`fedlight.plugin.eval_rows`): the largest activation a row, worked by
hand from the networks' layer shapes, the rows it allows under 32 MiB (33,554,432 B), and the engine's passes."""

from __future__ import annotations

import pytest
import torch

from fedlight.models import FedTSDPCNN, LeafCNN, LeNet5
from fedlight.plugin.eval_rows import (
    ACTIVATION_BUDGET_BYTES,
    cpu_eval_rows,
    largest_activation_bytes,
    rows_within_budget,
)
from helpers.federations import small_federation


@pytest.mark.parametrize(
    "make, shape, row_bytes, rows",
    [
        # 32 channels of 28x28 after the 'same' first convolution: 32*28*28*4 = 100,352 B; 512 rows are 51.4 MB,
        # 256 are 25.7 MB
        (lambda: LeafCNN(num_classes=62), (1, 1, 28, 28), 100_352, 256),
        # the second convolution's 64 channels of 28x28: 200,704 B; 256 rows are 51.4 MB, 128 are 25.7 MB
        (lambda: FedTSDPCNN(), (1, 3, 32, 32), 200_704, 128),
        # LeNet-5's first convolution, 6 channels of 28x28: 18,816 B; 512 rows are 9.6 MB
        (lambda: LeNet5(), (1, 3, 32, 32), 18_816, 512),
    ],
)
def test_rows_follow_the_largest_activation_worked_by_hand(make, shape, row_bytes, rows) -> None:
    network = make().eval()
    with torch.no_grad():
        assert largest_activation_bytes(network, torch.rand(shape)) == row_bytes
    assert cpu_eval_rows(network, torch.rand(shape)) == rows
    assert rows * row_bytes < ACTIVATION_BUDGET_BYTES <= 2 * rows * row_bytes or rows == 512


def test_rows_halve_down_to_the_fewest_and_no_further() -> None:
    assert rows_within_budget(0) == 512
    assert rows_within_budget(ACTIVATION_BUDGET_BYTES // 64) == 32  # 64 rows reach the budget exactly
    assert rows_within_budget(ACTIVATION_BUDGET_BYTES) == 16  # one row fills it: the fewest


@pytest.mark.parametrize("eval_batch_size, passes", [(None, [1, 512, 512, 76]), (300, [300, 300, 300, 200])])
def test_the_engine_evaluates_in_the_fitted_rows_unless_told(eval_batch_size, passes) -> None:
    """Digits' SmallCNN (16 channels of 8x8 at most: 4 KB a row) takes the most rows, 512, after one row read its
    activations; a given `eval_batch_size` is taken as it is, with no such row."""
    fed = small_federation(eval_batch_size=eval_batch_size)
    seen: list[int] = []
    fed.module.register_forward_pre_hook(lambda _module, args: seen.append(len(args[0])))
    view = fed.server.model
    outputs = view.outputs(fed.algorithm.models[0], torch.rand(1100, 1, 8, 8))
    assert outputs.shape == (1100, 10) and seen == passes
    view.outputs(fed.algorithm.models[0], torch.rand(40, 1, 8, 8))  # the same shape: its rows are remembered
    assert seen[len(passes) :] == [40]
