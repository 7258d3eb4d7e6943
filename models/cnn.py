"""Plain CNNs of the papers and a fast CNN for the bundled 8x8 digits.

- ``OCFLCNN``: OCFL's MNIST/FMNIST network ("One-Shot Clustering for Federated Learning Under
  Clustering-Agnostic Assumption", section 4.2: "inspired by Tiny-VGG"; the layers are the authors' code's
  ``FMNIST_Expanded_CNN``).
- ``FedTSDPCNN``: FedTSDP's CIFAR/SVHN network ("Federated Two Stage Decoupling With Adaptive Personalization
  Layers", section 4.1.2).
- ``FedAvgCNN``: FedAvg's CNN as PFLlib and FL-bench build it.
- ``LeafCNN``: LEAF's FEMNIST network ("LEAF: A Benchmark for Federated Settings", Caldas et al., 2018).
- ``SmallCNN``: a small, fast network for scikit-learn's digits (the quickstart default).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import default_layer_names, relu_max_pool


class OCFLCNN(nn.Module):
    """Three 5x5 'same' convs (16, 32, 32) without pooling, then FC 1000-250-100-C with dropout.

    About 25.4 M parameters for 28x28 inputs, almost all in fc1 (32*28*28 -> 1000).
    """

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        image_size: int = 28,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.conv3 = nn.Conv2d(32, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * image_size * image_size, 1000)
        self.fc2 = nn.Linear(1000, 250)
        self.fc3 = nn.Linear(250, 100)
        self.fc4 = nn.Linear(100, num_classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        x = torch.flatten(x, 1)
        x = self.dropout(F.relu(self.fc1(x)))
        x = self.dropout(F.relu(self.fc2(x)))
        x = self.dropout(F.relu(self.fc3(x)))
        return self.fc4(x)

    def layer_names(self) -> list[str]:
        """conv1, conv2, conv3, fc1, fc2, fc3, fc4."""
        return default_layer_names(self)


class FedTSDPCNN(nn.Module):
    """conv3x3(32)-ReLU-conv3x3(64)-ReLU-pool2-dropout .25-FC 512-ReLU-dropout .5-FC C.

    Four FL layers (conv1, conv2, fc1, fc2) as FedTSDP's L_total = 4. About 6.45 M parameters for
    32x32 inputs (fc1 is 64*14*14 = 12544 -> 512). Padding, activations and pooling are our choice (the
    common PyTorch two-conv example); the paper does not give them.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        side = (image_size - 4) // 2
        self.conv1 = nn.Conv2d(in_channels, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.pool = nn.MaxPool2d(2)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * side * side, 512)
        self.dropout2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = relu_max_pool(self.pool, self.conv2(x))
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)

    def layer_names(self) -> list[str]:
        """conv1, conv2, fc1, fc2."""
        return default_layer_names(self)


class ConvPoolCNN(nn.Module):
    """conv5x5(32)-ReLU-pool2-conv5x5(64)-ReLU-pool2-FC `hidden`-ReLU-FC C, the two-convolution CNN of FedAvg's paper
    that FedAvgCNN and LeafCNN build with their padding and dense width."""

    def __init__(self, in_channels: int, num_classes: int, image_size: int, padding: int, hidden: int) -> None:
        super().__init__()
        side = ((image_size + 2 * padding - 4) // 2 + 2 * padding - 4) // 2
        if side < 1:
            raise ValueError(f"{type(self).__name__} needs a larger image_size, got {image_size}")
        self.conv1 = nn.Conv2d(in_channels, 32, 5, padding=padding)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=padding)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * side * side, hidden)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = relu_max_pool(self.pool, self.conv1(x))
        x = relu_max_pool(self.pool, self.conv2(x))
        return self.fc(F.relu(self.fc1(torch.flatten(x, 1))))

    def layer_names(self) -> list[str]:
        """conv1, conv2, fc1, fc."""
        return default_layer_names(self)


class FedAvgCNN(ConvPoolCNN):
    """The CNN of FedAvg ("Communication-Efficient Learning of Deep Networks from Decentralized Data", McMahan et
    al., 2017, section 3) as PFLlib and FL-bench build it: conv5x5(32)-ReLU-pool2-conv5x5(64)-ReLU-pool2-FC 512-ReLU-
    FC C, without padding, so 582,026 parameters on 28x28 inputs (the paper's padded version has 1.66 M)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__(in_channels, num_classes, image_size, padding=0, hidden=512)


class LeafCNN(ConvPoolCNN):
    """LEAF's FEMNIST CNN (Caldas et al., 2018): conv5x5(32, 'same')-ReLU-pool2-conv5x5(64, 'same')-ReLU-pool2-FC
    2048-ReLU-FC C: 6,603,710 parameters on 28x28x1 inputs with 62 classes, almost all in fc1 (64*7*7 -> 2048).
    The network of cross-device runs at LEAF's size (3,400 writers, 10 a round)."""

    def __init__(self, in_channels: int = 1, num_classes: int = 62, image_size: int = 28) -> None:
        super().__init__(in_channels, num_classes, image_size, padding=2, hidden=2048)


class SmallCNN(nn.Module):
    """Two 3x3 'same' convs (width, 2*width) -> one 2x2 max-pool -> one linear layer.

    About 29 k parameters at the defaults; trains to ~98 % on the 8x8 digits in seconds on a CPU.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8, width: int = 32) -> None:
        super().__init__()
        side = image_size // 2
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(2 * width * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = relu_max_pool(self.pool, self.conv2(x))
        return self.fc(torch.flatten(x, 1))

    def layer_names(self) -> list[str]:
        """conv1, conv2, fc."""
        return default_layer_names(self)
