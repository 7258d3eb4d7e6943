"""ResNets: FLIS's ResNet-9 (GroupNorm) and CIFAR-style ResNet-18/34.

ResNet-9 follows FLIS's code (``src/models/resnet9.py``; "FLIS: Clustered Federated Learning via Inference
Similarity for Non-IID Data Distribution", section 3.1): conv3x3 (with bias) -> GroupNorm(32) -> ReLU blocks, two
residual pairs, global max-pool, one linear layer.

ResNet-18/34 follow the CIFAR variant (kuangliu / akamaster): the ResNet34 of OCFL ("One-Shot Clustering for
Federated Learning Under Clustering-Agnostic Assumption", section 4.2; the variant of the authors' code) and the
ResNet18 of FedTSDP ("Federated Two Stage Decoupling With Adaptive Personalization Layers", section 4.1.2):
3x3 stem at stride 1, no max-pool, BasicBlocks [2,2,2,2] / [3,4,6,3] with widths 64/128/256/512,
global average pool, one linear layer. BatchNorm by default; ``norm="group"`` swaps in GroupNorm,
whose lack of running statistics makes averaging client models safe.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Norm = Literal["batch", "group"]


def make_norm(norm: Norm, channels: int, groups: int = 32) -> nn.Module:
    """BatchNorm2d or GroupNorm(min(groups, channels)) over ``channels``."""
    if norm == "batch":
        return nn.BatchNorm2d(channels)
    if norm == "group":
        return nn.GroupNorm(min(groups, channels), channels)
    raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}")


def _conv_norm_relu(c_in: int, c_out: int, groups: int, pool: bool = False) -> nn.Sequential:
    layers = [
        nn.Conv2d(c_in, c_out, 3, padding=1),
        nn.GroupNorm(groups, c_out),
        nn.ReLU(inplace=True),
    ]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers)


class ResNet9(nn.Module):
    """FLIS's ResNet-9 (about 6.62 M parameters for 100 classes).

    Nine FL layers, one per weight layer: each conv-GroupNorm block and the final linear layer.
    The global max-pool is adaptive, so 28x28 inputs work too (the code's MaxPool2d(4) is the same
    thing on 32x32 inputs).
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 100, groups: int = 32) -> None:
        super().__init__()
        self.prep = _conv_norm_relu(in_channels, 64, groups)
        self.layer1_head = _conv_norm_relu(64, 128, groups, pool=True)
        self.layer1_residual = nn.Sequential(_conv_norm_relu(128, 128, groups), _conv_norm_relu(128, 128, groups))
        self.layer2 = _conv_norm_relu(128, 256, groups, pool=True)
        self.layer3_head = _conv_norm_relu(256, 512, groups, pool=True)
        self.layer3_residual = nn.Sequential(_conv_norm_relu(512, 512, groups), _conv_norm_relu(512, 512, groups))
        self.pool = nn.AdaptiveMaxPool2d(1)
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.prep(x)
        x = self.layer1_head(x)
        x = self.layer1_residual(x) + x
        x = self.layer2(x)
        x = self.layer3_head(x)
        x = self.layer3_residual(x) + x
        return self.linear(torch.flatten(self.pool(x), 1))

    def layer_names(self) -> list[str]:
        """One name per conv-GroupNorm block, then ``linear``."""
        return [
            "prep", "layer1_head", "layer1_residual.0", "layer1_residual.1", "layer2",
            "layer3_head", "layer3_residual.0", "layer3_residual.1", "linear",
        ]  # fmt: skip


class BasicBlock(nn.Module):
    """Two 3x3 conv-norm pairs plus an identity or 1x1 conv-norm shortcut."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: Norm, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = make_norm(norm, c_out, groups)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = make_norm(norm, c_out, groups)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                make_norm(norm, c_out, groups),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet built from BasicBlocks; see ``ResNet18`` and ``ResNet34``.

    FL layers (the units of FedTSDP's shared/personal split, section 3.3.2; not stated in the paper, our
    choice): the stem (conv + norm), each BasicBlock, then ``fc``.
    """

    def __init__(
        self,
        blocks: list[int],
        in_channels: int = 3,
        num_classes: int = 10,
        norm: Norm = "batch",
        groups: int = 32,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, padding=1, bias=False),
            make_norm(norm, 64, groups),
            nn.ReLU(inplace=True),
        )
        stages, c_in = [], 64
        for i, (n, c_out) in enumerate(zip(blocks, (64, 128, 256, 512))):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(c_in, c_out, stride, norm, groups)]
            stage += [BasicBlock(c_out, c_out, 1, norm, groups) for _ in range(n - 1)]
            stages.append(nn.Sequential(*stage))
            c_in = c_out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    def layer_names(self) -> list[str]:
        """stem, layer1.0, ..., layer4.<last>, fc."""
        stages = {"layer1": self.layer1, "layer2": self.layer2, "layer3": self.layer3, "layer4": self.layer4}
        blocks = [f"{stage}.{j}" for stage, layers in stages.items() for j in range(len(layers))]
        return ["stem", *blocks, "fc"]


class ResNet18(ResNet):
    """CIFAR ResNet-18 (about 11.17 M parameters for 10 classes)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, norm: Norm = "batch", groups: int = 32) -> None:
        super().__init__([2, 2, 2, 2], in_channels, num_classes, norm, groups)


class ResNet34(ResNet):
    """CIFAR ResNet-34 (about 21.28 M parameters for 10 classes)."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10, norm: Norm = "batch", groups: int = 32) -> None:
        super().__init__([3, 4, 6, 3], in_channels, num_classes, norm, groups)
