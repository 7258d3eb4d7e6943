"""Random images of a real data set's shapes, for timing: no download, any number of clients."""

from __future__ import annotations

import torch

from fedlight.datamodules.base import FederatedDataModule


class RandomImages(FederatedDataModule):
    """`samples` random (channels, size, size) images per client with `classes` random labels, cut IID into clients;
    `uint8` stores them as bytes (MNIST's and FEMNIST's storage), converted to [0, 1] floats batch by batch."""

    def __init__(
        self,
        num_clients: int,
        samples: int,
        channels: int = 1,
        size: int = 28,
        test_fraction: float = 0.0,
        classes: int = 10,
        uint8: bool = False,
    ) -> None:
        super().__init__(num_clients=num_clients, val_fraction=0.0, test_fraction=test_fraction)
        self.samples, self.channels, self.size, self.classes, self.uint8 = samples, channels, size, classes, uint8

    @property
    def num_classes(self) -> int:
        return self.classes

    def load_pool(self):
        g = torch.Generator().manual_seed(0)
        n, shape = (
            self.num_clients * self.samples,
            (self.num_clients * self.samples, self.channels, self.size, self.size),
        )
        x = (
            torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
            if self.uint8
            else torch.rand(shape, generator=g)
        )
        return x, torch.randint(0, self.classes, (n,), generator=g)

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        x, y = batch
        return (x.float().div_(255.0) if self.uint8 else x), y


class MnistLike(FederatedDataModule):
    """A pool of `size` random 1x28x28 uint8 images with 10 random labels (MNIST's shapes and storage), cut into
    clients by Dirichlet(`alpha`) label skew, all for training."""

    def __init__(self, num_clients: int, size: int = 70_000, alpha: float = 0.5) -> None:
        from fedlight.datamodules.partition import Dirichlet

        super().__init__(num_clients=num_clients, partition=Dirichlet(alpha=alpha), val_fraction=0.0, test_fraction=0.0)
        self.size = size

    @property
    def num_classes(self) -> int:
        return 10

    def load_pool(self):
        g = torch.Generator().manual_seed(0)
        return (
            torch.randint(0, 256, (self.size, 1, 28, 28), dtype=torch.uint8, generator=g),
            torch.randint(0, 10, (self.size,), generator=g),
        )

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        x, y = batch
        return x.float().div_(255.0), y
