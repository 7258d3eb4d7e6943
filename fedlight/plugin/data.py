"""The data contract between data modules and the engine: every client's samples as one tensor per split.

A data module gives the engine a `FederatedData` (client k owns rows `bounds[k]:bounds[k+1]` of each split, so a
client's data is a slice and a batch is a gather on the device) and a per-batch conversion
(`on_after_batch_transfer`, e.g. uint8 images to normalized floats). `fedlight.datamodules.FederatedDataModule`
builds one from any pool of samples and a partition scheme; any LightningDataModule that satisfies
`ClientDataModule` works too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import warnings
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
        """How many clients the split has (one fewer than `bounds`)."""
        return len(self.bounds) - 1

    def client(self, k: int) -> tuple[Tensor, Tensor]:
        """(x, y) of client `k`: its rows, as views."""
        lo, hi = self.bounds[k], self.bounds[k + 1]
        return self.x[lo:hi], self.y[lo:hi]

    def size(self, k: int) -> int:
        """How many rows client `k` has."""
        return self.bounds[k + 1] - self.bounds[k]

    def sizes(self) -> np.ndarray:
        """(clients,) every client's row count."""
        return np.diff(np.asarray(self.bounds))

    def client_of_row(self) -> Tensor:
        """(rows,) the client each row belongs to, on the split's device."""
        sizes = torch.as_tensor(self.sizes(), device=self.x.device)
        return torch.repeat_interleave(torch.arange(self.num_clients, device=self.x.device), sizes)

    def to(self, device: torch.device | str) -> "ClientSplit":
        """The split with `x` and `y` on `device` (the same bounds)."""
        return ClientSplit(self.x.to(device), self.y.to(device), self.bounds)

    def select(self, clients: np.ndarray) -> "ClientSplit":
        """The rows of the given clients, in that order (client j here is `clients[j]` there)."""
        rows = [torch.arange(self.bounds[k], self.bounds[k + 1]) for k in clients]
        index = torch.cat(rows).to(self.x.device) if rows else torch.zeros(0, dtype=torch.long, device=self.x.device)
        sizes = [len(r) for r in rows]
        return ClientSplit(self.x[index], self.y[index], np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist())


@dataclass
class FederatedData:
    """Everything the federation needs from the data: per-client splits, public data, ground truth."""

    train: ClientSplit
    val: ClientSplit
    test: ClientSplit
    num_classes: int
    cluster_labels: np.ndarray | None = None  # each client's true cluster, when the partition defines one
    public_x: Tensor | None = None  # the server's unlabelled public data, when held out
    info: dict = field(default_factory=dict)
    newcomers: "FederatedData | None" = None  # clients held out of training, to evaluate after it (their own data)

    @property
    def num_clients(self) -> int:
        """How many training clients there are (those of `train`; the newcomers are not counted)."""
        return self.train.num_clients

    def split(self, name: str) -> ClientSplit:
        """The split `name` ("train", "val" or "test"); another name is refused."""
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; the splits are {SPLITS}")
        return getattr(self, name)

    def largest_training_split(self) -> int:
        """The most training rows any client has, the held-out clients' included (they train with the same module)."""
        sizes = [*self.train.sizes(), *([] if self.newcomers is None else self.newcomers.train.sizes())]
        return int(max(sizes, default=0))

    def to(self, device: torch.device | str) -> "FederatedData":
        """The data with every split, the public data and the newcomers' data on `device`."""
        public = None if self.public_x is None else self.public_x.to(device)
        newcomers = None if self.newcomers is None else self.newcomers.to(device)
        return FederatedData(
            self.train.to(device),
            self.val.to(device),
            self.test.to(device),
            self.num_classes,
            self.cluster_labels,
            public,
            self.info,
            newcomers,
        )

    def select(self, clients: np.ndarray) -> "FederatedData":
        """The given clients alone, in that order (their splits, true clusters and the public data), with
        `info["partition_clients"]` naming each one's index here."""
        clients = np.asarray(clients, dtype=np.int64)
        train, val, test = (self.split(name).select(clients) for name in SPLITS)
        labels = None if self.cluster_labels is None else np.asarray(self.cluster_labels)[clients]
        return FederatedData(
            train,
            val,
            test,
            num_classes=self.num_classes,
            cluster_labels=labels,
            public_x=self.public_x,
            info={**self.info, "partition_clients": clients.tolist()},
        )

    def hold_out(self, clients: np.ndarray) -> "FederatedData":
        """The other clients, for training, with the given ones as `newcomers` (docs/architecture.md, "Data
        contract"): together they hold every client of this data exactly once."""
        held = np.asarray(clients, dtype=np.int64)
        training = self.select(np.setdiff1d(np.arange(self.num_clients), held))
        training.newcomers = self.select(held)
        return training


@runtime_checkable
class ClientDataModule(Protocol):
    """What the engine needs of a data module: `seed` is set before `prepare_data()` and `setup("fit")`, after
    which `federated` holds the clients."""

    seed: int
    federated: FederatedData | None

    def prepare_data(self) -> None:
        """Download or prepare what the data needs (`load_clients` calls it before `setup`, with `seed` set)."""
        ...

    def setup(self, stage: str) -> None:
        """Build the clients for `seed` into `federated` (`load_clients` calls it with "fit")."""
        ...

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """The batch converted on the device as the model takes it (e.g. uint8 images to normalized floats)."""
        ...


SMALL_EVALUATION = 10  # below this many evaluation samples per client, per-client accuracy is noise


def load_clients(data: ClientDataModule, seed: int) -> FederatedData:
    """Prepare and set up a data module for `seed` and return its clients (checked against the contract)."""
    if not isinstance(data, ClientDataModule):
        raise ValueError(
            f"{type(data).__name__} is not a federated data module: subclass "
            "fedlight.datamodules.FederatedDataModule (or provide seed, federated, prepare_data, setup "
            "and on_after_batch_transfer)"
        )
    data.seed = seed
    data.prepare_data()
    data.setup("fit")
    if not isinstance(data.federated, FederatedData):
        raise ValueError(f"{type(data).__name__}.setup() left no FederatedData in `federated`")
    return data.federated


def check_evaluation_split(sizes: np.ndarray, split: str) -> None:
    """Refuse a split with no sample at all; warn when some clients have none (they are left out of the means)
    or when most have so few that their accuracy is noise."""
    fix = (
        f"give the clients more samples or raise the data module's {split}_fraction"
        if split != "train"
        else "give the clients more samples"
    )
    if sizes.sum() == 0:
        raise ValueError(
            f"federation.eval_split={split!r}, but no client has a sample in that split: {fix}, or "
            "evaluate on eval_split='train'"
        )
    empty = int((sizes == 0).sum())
    if empty:
        warnings.warn(
            f"{empty} of {len(sizes)} clients have no {split!r} samples: they are left out of the {split} "
            f"means and their per-client values are empty ({fix})",
            stacklevel=3,
        )
    if np.median(sizes) < SMALL_EVALUATION:
        warnings.warn(
            f"most clients have fewer than {SMALL_EVALUATION} {split!r} samples (median "
            f"{float(np.median(sizes)):g}): their accuracy is noise ({fix})",
            stacklevel=3,
        )
