"""FedEM's synthetic mixture data set: every client's distribution is a mixture of M shared binary tasks, so no
client's data is another's and none is independent of the others; a benchmark on which personalized and clustered
methods separate, with as many test samples per client as a comparison needs.

The generator of "Federated Multi-Task Learning under a Mixture of Distributions" (Marfoq, Neglia, Bellet, Kameni,
Vidal, NeurIPS 2021), section 4 and its appendix on the synthetic data set (its Table 2 setting: 300 clients, M = 3,
d = 150, alpha = 0.4, noise 0.1):

- M components theta_m ~ U[-1, 1]^d, drawn once;
- client k's mixture weights pi_k ~ Dirichlet(alpha, ..., alpha) (smaller alpha: clients more dissimilar);
- client k's training size n_k = min(floor(LogNormal(4, 2)) + 50, 1000) (most clients small, a few large);
- a sample: its component z ~ Categorical(pi_k), x ~ U[-1, 1]^d, y = 1[theta_z . x + eps > 0] with
  eps ~ N(0, noise_level^2) (the authors' round(sigmoid(.))).

Where we differ from the authors' script (`generate_data.py`), and why: its loop over components never advances
its row offset, so every component labels the same first rows and the rows past the largest component's count keep
label 0 (a client's labels are then mostly 0, whatever its mixture). We label every sample by its own component, as
the paper's mixture model says; `tests/unit/test_synthetic_mixture.py` checks the labels' balance and that each
sample's label is its own component's. The script draws 5,000 test samples a client; `test_samples` sets it
(500 by default: one sample moves a client's accuracy by 0.002).

Each client's true cluster (`cluster_labels`, for the ARI of clustered methods) is its dominant component,
argmax_m pi_km; `info["oracle_test_acc"]` is the mean over clients of the accuracy of the Bayes rule that knows
theta and pi_k (predict 1 when the components voting 1 weigh more than half), an upper bound beside the table.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedlight.datamodules.base import FederatedData, FederatedDataModule


def training_sizes(rng: np.random.Generator, num_clients: int, minimum: int = 50, maximum: int = 1000) -> np.ndarray:
    """n_k = min(floor(LogNormal(4, 2)) + minimum, maximum), FedEM's client sizes."""
    return np.minimum(rng.lognormal(4.0, 2.0, num_clients).astype(np.int64) + minimum, maximum)


def draw_samples(
    rng: np.random.Generator, theta: np.ndarray, weights: np.ndarray, count: int, noise_level: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x (count, d), y (count,), each sample's component (count,)) of one client with mixture `weights`."""
    components = rng.choice(len(theta), size=count, p=weights)
    x = rng.uniform(-1.0, 1.0, size=(count, theta.shape[1]))
    scores = np.einsum("nd,nd->n", x, theta[components]) + rng.normal(0.0, noise_level, size=count)
    return x, (scores > 0).astype(np.int64), components


def oracle_accuracy(x: np.ndarray, y: np.ndarray, theta: np.ndarray, weights: np.ndarray) -> float:
    """Accuracy of the Bayes rule of a noiseless mixture on (x, y): 1 where the components voting 1 weigh > 1/2."""
    votes = (x @ theta.T > 0).astype(np.float64) @ weights
    return float(np.mean((votes > 0.5).astype(np.int64) == y))


class SyntheticMixture(FederatedDataModule):
    """FedEM's synthetic mixture (see the module doc), binary labels, features in [-1, 1]^dim.

    Args:
        num_clients: clients (FedEM's 300).
        num_components: M, the shared tasks (3).
        dim: feature dimension (150).
        alpha: Dirichlet concentration of each client's mixture weights (0.4).
        noise_level: standard deviation of the noise added to a sample's score (0.1).
        test_samples: test samples drawn for every client, from its own mixture (FedEM's script: 5,000).
        val_fraction: share of each client's training draw kept as its validation split.
        min_samples, max_samples: the bounds of a client's training size (50, 1000).
        public_size: unlabelled samples x ~ U[-1, 1]^dim for the server (FedTSDP's public data); 0: none.
        split_seed: seed of the draw; None uses the run's seed (each seed of a study sees a fresh draw).
        holdout_clients: clients held out of training, as in FederatedDataModule.
    """

    def __init__(
        self,
        num_clients: int = 300,
        num_components: int = 3,
        dim: int = 150,
        alpha: float = 0.4,
        noise_level: float = 0.1,
        test_samples: int = 500,
        val_fraction: float = 0.1,
        min_samples: int = 50,
        max_samples: int = 1000,
        public_size: int = 0,
        split_seed: int | None = None,
        holdout_clients: int | float = 0,
    ) -> None:
        super().__init__(
            num_clients=num_clients,
            val_fraction=val_fraction,
            test_fraction=0.0,
            public_size=public_size,
            split_seed=split_seed,
            holdout_clients=holdout_clients,
        )
        if num_components < 1 or dim < 1 or alpha <= 0 or noise_level < 0:
            raise ValueError(
                "num_components and dim must be >= 1, alpha > 0 and noise_level >= 0, got "
                f"{num_components}, {dim}, {alpha}, {noise_level}"
            )
        if test_samples < 1 or not 1 <= min_samples <= max_samples:
            raise ValueError(
                f"test_samples must be >= 1 and 1 <= min_samples <= max_samples, got {test_samples}, "
                f"{min_samples}, {max_samples}"
            )
        self.num_components, self.dim, self.alpha, self.noise_level = num_components, dim, alpha, noise_level
        self.test_samples, self.min_samples, self.max_samples = test_samples, min_samples, max_samples

    @property
    def num_classes(self) -> int:
        """Binary labels."""
        return 2

    def load_pool(self) -> tuple[Tensor, Tensor]:
        """Not a pooled data set: the clients are drawn directly (`build`)."""
        raise NotImplementedError("SyntheticMixture draws its clients in build(); it has no pool")

    def build(self) -> FederatedData:
        """theta, then each client's weights, training draw (cut into train and val) and test draw."""
        rng = np.random.default_rng(self.seed if self.split_seed is None else self.split_seed)
        theta = rng.uniform(-1.0, 1.0, size=(self.num_components, self.dim))
        weights = rng.dirichlet(np.full(self.num_components, self.alpha), size=self.num_clients)
        sizes = training_sizes(rng, self.num_clients, self.min_samples, self.max_samples)
        pieces: dict[str, list[tuple[Tensor, Tensor]]] = {"train": [], "val": [], "test": []}
        oracle = []
        for pi, n in zip(weights, sizes):
            x, y, _ = draw_samples(rng, theta, pi, int(n), self.noise_level)
            n_val = int(round(self.val_fraction * n))
            pieces["val"].append(_tensors(x[:n_val], y[:n_val]))
            pieces["train"].append(_tensors(x[n_val:], y[n_val:]))
            x_test, y_test, _ = draw_samples(rng, theta, pi, self.test_samples, self.noise_level)
            pieces["test"].append(_tensors(x_test, y_test))
            oracle.append(oracle_accuracy(x_test, y_test, theta, pi))
        public = rng.uniform(-1.0, 1.0, size=(self.public_size, self.dim)) if self.public_size else None
        return FederatedData(
            self._stack(pieces["train"]),
            self._stack(pieces["val"]),
            self._stack(pieces["test"]),
            num_classes=2,
            cluster_labels=weights.argmax(axis=1),
            public_x=None if public is None else torch.tensor(public, dtype=torch.float32),
            info={
                "pool_size": int(sizes.sum()) + self.test_samples * self.num_clients,
                "public_size": self.public_size,
                "oracle_test_acc": float(np.mean(oracle)),
            },
        )


def _tensors(x: np.ndarray, y: np.ndarray) -> tuple[Tensor, Tensor]:
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)
