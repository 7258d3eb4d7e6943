"""LeNet-5 as FLIS's code uses it (NIID-Bench ``SimpleCNN`` / ``SimpleCNNMNIST``).

FLIS ("FLIS: Clustered Federated Learning via Inference Similarity for Non-IID Data Distribution", section 3.1)
names LeNet-5; the layers are its code's: conv(in->6, 5x5) -> ReLU -> pool2 -> conv(6->16, 5x5) -> ReLU -> pool2 ->
FC 120 -> ReLU -> FC 84 -> ReLU -> FC C. No padding, BatchNorm or dropout. The flatten size follows
the input: 16*5*5 = 400 for 32x32 (CIFAR-10, SVHN), 16*4*4 = 256 for 28x28 (FMNIST). `batch_norm=True` adds a
BatchNorm2d after each convolution (not in FLIS; for FedBN and the BatchNorm benchmarks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import default_layer_names, relu_max_pool


class LeNet5(nn.Module):
    """LeNet-5 for (n, in_channels, image_size, image_size) images."""

    def __init__(
        self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32, batch_norm: bool = False
    ) -> None:
        super().__init__()
        side = ((image_size - 4) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"LeNet5 needs image_size >= 16, got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, 6, 5)
        self.bn1 = nn.BatchNorm2d(6) if batch_norm else nn.Identity()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.bn2 = nn.BatchNorm2d(16) if batch_norm else nn.Identity()
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = relu_max_pool(self.pool, self.bn1(self.conv1(x)))
        x = relu_max_pool(self.pool, self.bn2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)

    def layer_names(self) -> list[str]:
        """conv1, (bn1,) conv2, (bn2,) fc1, fc2, fc3."""
        return default_layer_names(self)
