"""Multi-layer perceptron for tabular data and flattened images."""

from __future__ import annotations

import torch
from torch import nn

from .layers import default_layer_names


class MLP(nn.Module):
    """Flatten -> [Linear -> ReLU -> Dropout] per hidden width -> Linear(num_classes)."""

    def __init__(self, input_dim: int, hidden: list[int], num_classes: int, dropout: float = 0.0) -> None:
        super().__init__()
        widths = [input_dim, *hidden]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        for layer in self.hidden:
            x = self.dropout(torch.relu(layer(x)))
        return self.out(x)

    def layer_names(self) -> list[str]:
        """hidden.0, ..., hidden.<k-1>, out."""
        return default_layer_names(self)
