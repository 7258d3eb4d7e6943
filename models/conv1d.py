"""1-D CNN for windows of accelerometer data (WISDM activity recognition)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import default_layer_names, relu_max_pool


class Conv1DNet(nn.Module):
    """Channels-first (n, in_channels, window) input.

    conv(k5, 32)-ReLU-pool2 -> conv(k5, 64)-ReLU-pool2 -> FC 100-ReLU-dropout -> FC C.
    'Same' padding, so the flatten size is 64 * (window // 4).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 6, window: int = 200, dropout: float = 0.5) -> None:
        super().__init__()
        if window < 4:
            raise ValueError(f"Conv1DNet needs window >= 4, got {window}")
        self.conv1 = nn.Conv1d(in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv1d(32, 64, 5, padding=2)
        self.pool = nn.MaxPool1d(2)
        self.fc1 = nn.Linear(64 * (window // 2 // 2), 100)
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(100, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = relu_max_pool(self.pool, self.conv1(x))
        x = relu_max_pool(self.pool, self.conv2(x))
        x = self.dropout(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)

    def layer_names(self) -> list[str]:
        """conv1, conv2, fc1, fc2."""
        return default_layer_names(self)
