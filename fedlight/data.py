"""The data contract between data modules and the engine: every client's samples as one tensor per split.

A data module gives the engine a `FederatedData` (client k owns rows `bounds[k]:bounds[k+1]` of each split, so a
client's data is a slice and a batch is a gather on the device) and a per-batch conversion
(`on_after_batch_transfer`, e.g. uint8 images to normalized floats). `fedlight.datamodules.FederatedDataModule`
builds one from any pool of samples and a partition scheme; any LightningDataModule that satisfies
`ClientDataModule` works too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor

SPLITS = ("train", "val", "test")


@dataclass
class ClientSplit:
    """One split of every client: client k owns rows `bounds[k]:bounds[k+1]` of `x` and `y`."""

    x: Tensor
    y: Tensor
    bounds: list[int]

    @property
    def num_clients(self) -> int:
        return len(self.bounds) - 1

    def client(self, k: int) -> tuple[Tensor, Tensor]:
        lo, hi = self.bounds[k], self.bounds[k + 1]
        return self.x[lo:hi], self.y[lo:hi]

    def size(self, k: int) -> int:
        return self.bounds[k + 1] - self.bounds[k]

    def sizes(self) -> np.ndarray:
        return np.diff(np.asarray(self.bounds))

    def client_of_row(self) -> Tensor:
        """(rows,) the client each row belongs to, on the split's device."""
        sizes = torch.as_tensor(self.sizes(), device=self.x.device)
        return torch.repeat_interleave(torch.arange(self.num_clients, device=self.x.device), sizes)

    def to(self, device: torch.device | str) -> "ClientSplit":
        return ClientSplit(self.x.to(device), self.y.to(device), self.bounds)


@dataclass
class FederatedData:
    """Everything the federation needs from the data: per-client splits, public data, ground truth."""

    train: ClientSplit
    val: ClientSplit
    test: ClientSplit
    num_classes: int
    cluster_labels: np.ndarray | None = None  # each client's true cluster, when the partition defines one
    public_x: Tensor | None = None            # the server's unlabelled public data, when held out
    info: dict = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    def split(self, name: str) -> ClientSplit:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; the splits are {SPLITS}")
        return getattr(self, name)

    def to(self, device: torch.device | str) -> "FederatedData":
        public = None if self.public_x is None else self.public_x.to(device)
        return FederatedData(self.train.to(device), self.val.to(device), self.test.to(device),
                             self.num_classes, self.cluster_labels, public, self.info)


@runtime_checkable
class ClientDataModule(Protocol):
    """What the engine needs of a data module: `seed` is set before `prepare_data()` and `setup("fit")`, after
    which `federated` holds the clients."""

    seed: int
    federated: FederatedData | None

    def prepare_data(self) -> None: ...

    def setup(self, stage: str) -> None: ...

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any: ...
