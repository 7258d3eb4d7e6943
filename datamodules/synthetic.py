"""p-FClus's synthetic data sets Syn-NO, Syn-LO and Syn-O: 2-D Gaussians spread over clients so that every client
holds points of exactly H of them (the heterogeneity level). Labels are the true Gaussian ids, so a clustering
of the points can be scored with the adjusted Rand index.

The generator is the one of the p-FClus code (`synthetic_dataset/data_gen_{no,lil,lot}.py`), with the paper's
10 Gaussians (the scripts use 20): Gaussian i has mean (m_i, m_i) and standard deviation s per coordinate,

- NO (no overlap):      m_i = 10 i,                                   s = 1
- LO (little overlap):  m_i = 10 (i + floor(i/2)),                    s = 2  (pairs 0/10, 30/40, 60/70, ...)
- O  (overlap):         m_i = 9 (i + 2 floor(i/2)) for i < 6, else 10 (i + 2 floor(i/2)),  s = 3
                        (pairs 0/9, 36/45, 72/81, 120/130, 160/170)

Client j (0-based) gets n_j = points_per_client + j * size_step points (size_step = 0: balanced, > 0:
unequal): it picks H Gaussians uniformly without replacement and draws ceil(n_j / H) fresh points from each in
turn, stopping at n_j. The points stay in that order (p-FClus's personalization visits them in stored order).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedData, FederatedDataModule

Overlap = Literal["NO", "LO", "O"]


def gaussian_means(overlap: Overlap, count: int = 10) -> tuple[np.ndarray, float]:
    """(mean coordinate m_i of each Gaussian, standard deviation) of a Syn set."""
    i = np.arange(count)
    if overlap == "NO":
        return 10.0 * i, 1.0
    if overlap == "LO":
        return 10.0 * (i + i // 2), 2.0
    if overlap == "O":
        return np.where(i < 6, 9.0, 10.0) * (i + 2 * (i // 2)), 3.0
    raise ValueError(f"overlap must be 'NO', 'LO' or 'O', got {overlap!r}")


def client_sizes(num_clients: int, points_per_client: int, size_step: int) -> np.ndarray:
    """n_j = points_per_client + j * size_step."""
    return points_per_client + size_step * np.arange(num_clients)


class SyntheticGaussians(FederatedDataModule):
    """Syn-NO / Syn-LO / Syn-O with heterogeneity H (see the module doc). The data is drawn from the run's seed
    (or `split_seed`), so each seed of a study sees a fresh draw, as in the paper.

    Args:
        overlap: "NO", "LO" or "O" (quote them in YAML files: a bare NO reads as the boolean false).
        heterogeneity: H, the number of Gaussians each client holds points of (1..num_gaussians).
        num_clients: Z.
        points_per_client: p, the size of client 0 (of every client when size_step = 0).
        size_step: a, the size increase from one client to the next (0: balanced; our unequal setting, not
            stated in the paper, is Z = 50, p = 50, a = 10).
        num_gaussians: number of Gaussians (the paper's 10).
        val_fraction, test_fraction: shares of each client's points held out (default none: a clustering is
            scored on the data it fits, with `federation.eval_split: train`).
        split_seed: seed of the draw; None uses the run's seed.
        holdout_clients: clients held out of training, as in FederatedDataModule.
    """

    def __init__(
        self,
        overlap: Overlap = "NO",
        heterogeneity: int = 2,
        num_clients: int = 100,
        points_per_client: int = 100,
        size_step: int = 0,
        num_gaussians: int = 10,
        val_fraction: float = 0.0,
        test_fraction: float = 0.0,
        split_seed: int | None = None,
        holdout_clients: int | float = 0,
    ) -> None:
        super().__init__(
            num_clients=num_clients,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            split_seed=split_seed,
            holdout_clients=holdout_clients,
        )
        gaussian_means(overlap)  # validates the name
        if not 1 <= heterogeneity <= num_gaussians:
            raise ValueError(f"heterogeneity must be in 1..{num_gaussians}, got {heterogeneity}")
        if points_per_client < 1 or size_step < 0:
            raise ValueError(f"points_per_client must be >= 1 and size_step >= 0, got {points_per_client}, {size_step}")
        self.overlap, self.heterogeneity = overlap, heterogeneity
        self.points_per_client, self.size_step, self.num_gaussians = points_per_client, size_step, num_gaussians

    @property
    def num_classes(self) -> int:
        """The number of Gaussians: a point's label is its Gaussian's id."""
        return self.num_gaussians

    def generate(self, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
        """(points (n_j, 2), Gaussian ids (n_j,)) of every client, in generation order."""
        means, sigma = gaussian_means(self.overlap, self.num_gaussians)
        clients = []
        for n in client_sizes(self.num_clients, self.points_per_client, self.size_step):
            picks = rng.choice(self.num_gaussians, size=self.heterogeneity, replace=False)
            per = math.ceil(n / self.heterogeneity)
            xs, ys, left = [], [], int(n)
            for g in picks:
                m = min(per, left)
                if m == 0:
                    break
                xs.append(means[g] + sigma * rng.standard_normal((m, 2)))
                ys.append(np.full(m, g))
                left -= m
            clients.append((np.concatenate(xs), np.concatenate(ys)))
        return clients

    def load_pool(self) -> tuple[Tensor, Tensor]:
        """All clients' points pooled (with the run's seed), e.g. for inspection."""
        clients = self.generate(np.random.default_rng(self.seed if self.split_seed is None else self.split_seed))
        return (
            torch.tensor(np.concatenate([c[0] for c in clients]), dtype=torch.float32),
            torch.tensor(np.concatenate([c[1] for c in clients]), dtype=torch.long),
        )

    def build(self) -> FederatedData:
        """The clients as `generate` draws them, each client's points split into train, val and test by `val_fraction`
        and `test_fraction` (all train by default), with no true clusters."""
        rng = np.random.default_rng(self.seed if self.split_seed is None else self.split_seed)
        pieces: dict[str, list[tuple[Tensor, Tensor]]] = {"train": [], "val": [], "test": []}
        for x, y in self.generate(rng):
            n = len(y)
            n_val, n_test = int(round(self.val_fraction * n)), int(round(self.test_fraction * n))
            if n_val + n_test == 0:
                cuts = {"train": np.arange(n), "val": np.arange(0), "test": np.arange(0)}
            else:
                order = rng.permutation(n)
                cuts = {"val": order[:n_val], "test": order[n_val : n_val + n_test], "train": order[n_val + n_test :]}
            if len(cuts["train"]) == 0:
                raise ValueError(f"a client of {n} points has no training points: lower val/test_fraction")
            for split, rows in cuts.items():
                rows = np.sort(rows)
                pieces[split].append(
                    (torch.tensor(x[rows], dtype=torch.float32), torch.tensor(y[rows], dtype=torch.long))
                )
        total = sum(len(p[1]) for s in pieces.values() for p in s)
        train, val, test = (self._stack(pieces[s]) for s in ("train", "val", "test"))
        return FederatedData(
            train,
            val,
            test,
            num_classes=self.num_classes,
            cluster_labels=None,
            info={"pool_size": total, "public_size": 0, "overlap": self.overlap, "heterogeneity": self.heterogeneity},
        )
