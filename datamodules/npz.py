"""A user's own arrays from one `.npz` file (inputs and integer labels), cut into clients like any pool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedDataModule


def require_file(path: Path, how_to_get: str) -> Path:
    """Stop with an error naming the missing file and how to get it."""
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}\n  {how_to_get}")
    return path


class NpzFederated(FederatedDataModule):
    """Samples from `path`, an `.npz` with an input array (`x_key`) and an integer label array (`y_key`).

    Args:
        path: the `.npz` file.
        x_key: name of the input array (N, ...); uint8 inputs are scaled to [0, 1] per batch on the device.
        y_key: name of the label array (N,) or (N, 1).
        num_clients, partition, ...: as in `FederatedDataModule`.
    """

    def __init__(self, path: str, x_key: str = "x", y_key: str = "y", **kwargs) -> None:
        super().__init__(**kwargs)
        self.path, self.x_key, self.y_key = Path(path), x_key, y_key
        self._num_classes: int | None = None

    @property
    def num_classes(self) -> int:
        """The largest label in the file plus 1 (the file is read the first time it is asked)."""
        if self._num_classes is None:
            self.load_pool()
        assert self._num_classes is not None  # set by `load_pool`
        return self._num_classes

    def load_pool(self) -> tuple[Tensor, Tensor]:
        how = f"create it with numpy.savez({str(self.path)!r}, {self.x_key}=inputs, {self.y_key}=labels)"
        with np.load(require_file(self.path, how)) as arrays:
            missing = {self.x_key, self.y_key} - set(arrays.files)
            if missing:
                raise ValueError(f"{self.path} lacks arrays {sorted(missing)}; it holds {arrays.files}")
            x, y = torch.from_numpy(arrays[self.x_key]), torch.from_numpy(arrays[self.y_key].reshape(-1))
        if len(x) != len(y):
            raise ValueError(f"{self.path}: {len(x)} inputs but {len(y)} labels")
        self._num_classes = int(y.max()) + 1
        return (x if x.dtype == torch.uint8 else x.float()), y.long()

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        x, y = batch
        return (x.float() / 255.0 if x.dtype == torch.uint8 else x), y
