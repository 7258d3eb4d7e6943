"""scikit-learn's bundled digits (1,797 real 8x8 images, 10 classes): the embedded default, no download."""

from __future__ import annotations

import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedDataModule


class DigitsFederated(FederatedDataModule):
    """The digits images as (N, 1, 8, 8) floats in [0, 1], cut into clients by any partition scheme."""

    @property
    def num_classes(self) -> int:
        """10: the digits 0-9."""
        return 10

    def load_pool(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        return x, torch.tensor(digits.target, dtype=torch.long)
