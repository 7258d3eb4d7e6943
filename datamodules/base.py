"""The federated data module: a pool of samples cut into clients, kept as tensors on the device, in the form of
the engine's data contract (`fedlight.plugin.data`: `FederatedData` of `ClientSplit`s).

A subclass only says how to load its pool (`load_pool`); the base class holds out the server's public
data, partitions the rest with a `PartitionScheme`, applies the scheme's per-cluster transform, splits
each client's samples into train/val/test, and stores every split as one tensor with per-client row
ranges, so that a client's data is a slice and batches are gathers on the device (docs/architecture.md,
Speed).

Official splits (optional): a data set with its own train/val/test split (MedMNIST, torchvision sets, LEAF)
may set `self.pool_splits` in `load_pool`, one code per sample (`OFFICIAL_TRAIN`, `OFFICIAL_VAL`,
`OFFICIAL_TEST`). Then the partition still cuts the whole pool (so a client's test data follows its own
distribution), but each client's official test samples form its test split, its official val samples its
val split (when the set has a val split; otherwise `val_fraction` of its official training samples), and
`test_fraction` is not used; the public data is drawn from official training samples only. Without
`pool_splits` nothing changes.
"""

from __future__ import annotations

import zlib

import lightning as L
import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.data import SPLITS, ClientSplit, FederatedData
from fedlight.datamodules.partition import IID, PartitionScheme, largest_remainders

OFFICIAL_TRAIN, OFFICIAL_VAL, OFFICIAL_TEST = 0, 1, 2  # codes of `pool_splits`


class FederatedDataModule(L.LightningDataModule):
    """Base class of every federated data set.

    Args:
        num_clients: how many clients the pool is cut into.
        partition: the partition scheme (IID by default); cluster schemes define true clusters.
        val_fraction: share of each client's samples kept for its validation split.
        test_fraction: share of each client's samples kept for its test split.
        public_size: samples held out (before partitioning) as the server's unlabelled public data (drawn from
            the official training split when the data set sets `pool_splits`).
        split_seed: seed of the split; None uses the run's seed.
        holdout_clients: clients held out of training, evaluated after it as newcomers (`unseen/*`): a share in
            (0, 1) of the `num_clients` the partition makes, or a count. They are cut from those clients, so a
            run with and without holdout partitions the data alike and trains `num_clients` minus these; they
            come from every true cluster in proportion to its size (when the partition defines clusters), drawn
            from a stream of the split's seed of their own. 0: none.
    """

    def __init__(
        self,
        num_clients: int = 10,
        partition: PartitionScheme | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        public_size: int = 0,
        split_seed: int | None = None,
        holdout_clients: int | float = 0,
    ) -> None:
        super().__init__()
        if num_clients < 1:
            raise ValueError(f"num_clients must be at least 1, got {num_clients}")
        if not 0 <= val_fraction + test_fraction < 1:
            raise ValueError("val_fraction + test_fraction must be in [0, 1): each client needs training data")
        self.holdout_clients = holdout_clients  # checked in `setup`, once the clients are known, in one line
        self.num_clients = num_clients
        self.partition = partition if partition is not None else IID()
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.public_size = public_size
        self.split_seed = split_seed
        self.seed = 0
        self.federated: FederatedData | None = None
        self.pool_owners: np.ndarray | None = None  # set by load_pool of data sets with natural owners
        self.pool_splits: np.ndarray | None = None  # set by load_pool of data sets with official splits

    # -- what a subclass provides ------------------------------------------------------------------
    def load_pool(self) -> tuple[Tensor, Tensor]:
        """Return all samples (x, integer labels y) this data set offers. Data sets with natural owners
        (FEMNIST writers, WISDM users) also set `self.pool_owners`, one owner id per sample; data sets with
        official splits may set `self.pool_splits`, one OFFICIAL_* code per sample (see the module doc)."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        """How many classes the labels take (0..num_classes-1); each data set gives its own."""
        raise NotImplementedError

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        """Per-batch conversion on the device (e.g. uint8 images to normalized floats)."""
        return batch

    # -- building the clients ----------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.federated is None:
            data = self.build()
            if self.holdout_clients:
                seed = self.seed if self.split_seed is None else self.split_seed
                count = holdout_count(self.holdout_clients, data.num_clients)
                data = data.hold_out(choose_holdout(count, data.num_clients, data.cluster_labels, seed))
            self.federated = data

    def build(self) -> FederatedData:
        """The clients from the pool, seeded by `split_seed` (else the run's seed): the public samples set aside
        (training samples only), the rest cut into `num_clients` clients by `partition` (each client then changed by
        its `transform_client`), and each client's rows split into train, val and test (by the official splits when
        the pool has them, else by `val_fraction` and `test_fraction`)."""
        seed = self.seed if self.split_seed is None else self.split_seed
        rng = np.random.default_rng(seed)
        x, y = self.load_pool()
        labels = y.numpy()
        public_x = None
        owners = self.pool_owners
        official = None if self.pool_splits is None else np.asarray(self.pool_splits)
        if official is not None and len(official) != len(labels):
            raise ValueError(f"pool_splits has {len(official)} entries for {len(labels)} samples")
        keep = np.arange(len(labels))
        if self.public_size:
            # public data comes from training samples only (all samples when there is no official split)
            candidates = keep if official is None else np.flatnonzero(official == OFFICIAL_TRAIN)
            if self.public_size >= len(candidates):
                raise ValueError(
                    f"public_size={self.public_size} leaves no data for the clients "
                    f"(the pool has {len(candidates)} training samples)"
                )
            perm = rng.permutation(len(candidates))
            public = np.sort(candidates[perm[: self.public_size]])
            public_x, keep = x[public], np.setdiff1d(keep, public)
        parts = self.partition.assign(
            labels[keep], self.num_clients, rng, None if owners is None else np.asarray(owners)[keep]
        )
        if len(parts) != self.num_clients:
            raise ValueError(f"{type(self.partition).__name__} made {len(parts)} clients, expected {self.num_clients}")
        clusters = self.partition.cluster_labels(self.num_clients)
        pieces: dict[str, list[tuple[Tensor, Tensor]]] = {s: [] for s in SPLITS}
        for k, part in enumerate(parts):
            idx = torch.from_numpy(keep[part])
            xk, yk = x[idx], y[idx]
            xk, yk = self.partition.transform_client(xk, yk, k, None if clusters is None else int(clusters[k]))
            if official is None:
                order = torch.from_numpy(rng.permutation(len(idx)))
                n_val, n_test = int(round(self.val_fraction * len(idx))), int(round(self.test_fraction * len(idx)))
                cuts = {"val": order[:n_val], "test": order[n_val : n_val + n_test], "train": order[n_val + n_test :]}
            else:
                cuts = self._official_cuts(official[keep[part]], bool((official == OFFICIAL_VAL).any()), rng)
            if len(cuts["train"]) == 0:
                raise ValueError(
                    f"client {k} has no training samples ({len(idx)} in all): use fewer clients "
                    "or a partition with a larger minimum size"
                )
            for split, rows in cuts.items():
                rows = rows.sort().values
                pieces[split].append((xk[rows], yk[rows]))
        train, val, test = (self._stack(pieces[s]) for s in SPLITS)
        return FederatedData(
            train,
            val,
            test,
            num_classes=self.num_classes,
            cluster_labels=clusters,
            public_x=public_x,
            info={"pool_size": len(labels), "public_size": self.public_size, "official_splits": official is not None},
        )

    def _official_cuts(self, codes: np.ndarray, has_val: bool, rng: np.random.Generator) -> dict[str, Tensor]:
        """One client's rows by official split; val is cut from training rows when the set has no val split."""
        train = np.flatnonzero(codes == OFFICIAL_TRAIN)
        if has_val:
            val = np.flatnonzero(codes == OFFICIAL_VAL)
        else:
            order = rng.permutation(len(train))
            n_val = int(round(self.val_fraction * len(train)))
            val, train = train[order[:n_val]], train[order[n_val:]]
        return {
            "val": torch.from_numpy(val),
            "test": torch.from_numpy(np.flatnonzero(codes == OFFICIAL_TEST)),
            "train": torch.from_numpy(train),
        }

    @staticmethod
    def _stack(pieces: list[tuple[Tensor, Tensor]]) -> ClientSplit:
        bounds = np.concatenate([[0], np.cumsum([len(p[1]) for p in pieces])]).tolist()
        return ClientSplit(torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces]), bounds)


def holdout_count(holdout: int | float, num_clients: int) -> int:
    """How many of `num_clients` clients `data.init_args.holdout_clients` holds out (a share is rounded, and at
    least one); refused in one line when it leaves no client to train."""
    key = "data.init_args.holdout_clients"
    if (
        isinstance(holdout, bool)
        or not isinstance(holdout, (int, float))
        or holdout < 0
        or (isinstance(holdout, float) and holdout >= 1)
    ):
        raise ValueError(f"{key}={holdout!r}: give a share in (0, 1) or a whole count of clients (0: none)")
    count = int(holdout) if isinstance(holdout, int) else max(1, round(holdout * num_clients)) if holdout else 0
    if count >= num_clients:
        raise ValueError(
            f"{key}={holdout!r} holds out {count} of the {num_clients} clients and leaves none to "
            f"train: hold out fewer (a share below {(num_clients - 1) / num_clients:.2f} or a count "
            f"below {num_clients})"
        )
    return count


def choose_holdout(count: int, num_clients: int, clusters: np.ndarray | None, seed: int) -> np.ndarray:
    """`count` clients to hold out, sorted: each true cluster gives its share of them (largest remainders, so
    every cluster gives one as soon as there are as many as clusters), the clients of a cluster drawn at random
    from (seed, "holdout"), a stream of its own that leaves the partition unchanged."""
    rng = np.random.default_rng([seed, zlib.crc32(b"holdout")])
    groups = np.zeros(num_clients, dtype=np.int64) if clusters is None else np.unique(clusters, return_inverse=True)[1]
    sizes = np.bincount(groups)
    quota = largest_remainders(count, sizes)
    emptied = np.flatnonzero(quota >= sizes)
    if clusters is not None and len(emptied):
        cluster = np.unique(clusters)[emptied[0]]
        raise ValueError(
            f"data.init_args.holdout_clients holds out all {sizes[emptied[0]]} clients of true cluster "
            f"{cluster}, leaving it none to train: hold out fewer clients or give that cluster more"
        )
    return np.sort(
        np.concatenate([rng.choice(np.flatnonzero(groups == g), size=q, replace=False) for g, q in enumerate(quota)])
    )
