"""A k-centroid "model" for federated data clustering (p-FClus, k-FED, MFC, CentClus).

The model is its k centers, one (k, h) parameter, so it lives in the engine's flat vector, its checkpoints and
its per-cluster / per-client model matrices like any network. `forward(x)` gives the l-norm distances of the
points to the centers; `client_metrics` turns them into each client's clustering cost, with power l (the
(k, l)-clustering objective of the paper's Definition 2) and with power 1 (the unsquared distance that the
p-FClus reference code reports), and each client's adjusted Rand index against the true labels.

Data-clustering algorithms fit the centers themselves (k-means, k-medoids) by overriding `train_client`; the
module still has a `training_step` (mean d^l to the nearest center) and an SGD optimizer, so gradient-based
algorithms can train it too (online k-means by SGD).
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn

from fedlight.cluster import kcenters


def per_client_ari(labels_true: Tensor, labels_pred: Tensor, client: Tensor, num_clients: int) -> Tensor:
    """Adjusted Rand index of every client's points at once, as scikit-learn defines it (pair-counting form,
    1.0 when no pair is split differently, e.g. one true class and one cluster). Clients with no points get 1."""
    true = labels_true.long()
    pred = labels_pred.long()
    n_true, n_pred = int(true.max()) + 1, int(pred.max()) + 1
    cells = torch.bincount((client * n_true + true) * n_pred + pred, minlength=num_clients * n_true * n_pred)
    table = cells.view(num_clients, n_true, n_pred).double()
    n = table.sum(dim=(1, 2))
    sum_squares = (table**2).sum(dim=(1, 2))
    rows, cols = table.sum(dim=2), table.sum(dim=1)  # true class sizes, cluster sizes
    tp = sum_squares - n
    fp = (table * cols[:, None, :]).sum(dim=(1, 2)) - sum_squares
    fn = (table * rows[:, :, None]).sum(dim=(1, 2)) - sum_squares
    tn = n**2 - fp - fn - sum_squares
    denominator = (tp + fn) * (fn + tn) + (tp + fp) * (fp + tn)
    ari = 2.0 * (tp * tn - fn * fp) / torch.where(denominator == 0, torch.ones_like(denominator), denominator)
    return torch.where((fn == 0) & (fp == 0), torch.ones_like(ari), ari)


class CentroidModel(L.LightningModule):
    """k centers in h dimensions, scored by the l-norm distance.

    Args:
        num_centers: k.
        dim: h, the number of features of a point (images are flattened).
        ell: the norm of the distance and the power of the cost (2: k-means, 1: k-medoids with L1); any finite
            l >= 1.
        medoids: centers must be data points (k-medoids); default True for l = 1, False otherwise.
        score_labels: report each client's adjusted Rand index against the data's labels (turn off when the
            labels are not the distributions being clustered).
        lr: SGD learning rate, used only by algorithms that train the centers by gradient steps.
        init_scale: standard deviation of the random initial centers (algorithms that fit the centers ignore it).
    """

    def __init__(
        self,
        num_centers: int = 10,
        dim: int = 2,
        ell: float = 2.0,
        medoids: bool | None = None,
        score_labels: bool = True,
        lr: float = 0.05,
        init_scale: float = 1.0,
    ) -> None:
        super().__init__()
        if num_centers < 1 or dim < 1:
            raise ValueError(f"num_centers and dim must be at least 1, got {num_centers} and {dim}")
        if not ell >= 1 or ell == float("inf"):
            raise ValueError(f"ell must be a finite number >= 1, got {ell}")
        self.num_centers, self.dim, self.ell = num_centers, dim, float(ell)
        self.medoids = (ell == 1) if medoids is None else medoids
        self.score_labels = score_labels
        self.lr = lr
        self.centers = nn.Parameter(torch.randn(num_centers, dim) * init_scale)

    # -- the flat-vector view the algorithms use -------------------------------------------------------
    def centers_of(self, flat: Tensor) -> Tensor:
        """(..., k, h) centers of flat model vectors (..., k*h)."""
        return flat.reshape(*flat.shape[:-1], self.num_centers, self.dim)

    def points(self, x: Tensor) -> Tensor:
        """Inputs as (n, h) points in the centers' dtype (images flattened)."""
        points = x.reshape(len(x), -1).to(self.centers.dtype)
        if points.shape[1] != self.dim:
            raise ValueError(
                f"the data has {points.shape[1]} features per point but the model was built with "
                f"dim={self.dim}: set model.init_args.dim: {points.shape[1]}"
            )
        return points

    # -- LightningModule ---------------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """(n, k) l-norm distances of the points to the centers."""
        return kcenters.distances(self.points(x), self.centers, self.ell)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """Mean d^l to the nearest center (the clustering objective, for SGD-trained centers)."""
        x, _ = batch
        return kcenters.power(self(x).min(dim=1).values, self.ell).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def client_metrics(self, outputs: Tensor, y: Tensor, client: Tensor, num_clients: int) -> dict[str, Tensor]:
        """Per client: `cost` = mean d^l to the nearest center, `cost_p1` = mean d (unsquared for l = 2),
        and `ari` = adjusted Rand index of the nearest-center labels against `y` (when `score_labels`)."""
        dmin, labels = outputs.min(dim=1)
        size = torch.bincount(client, minlength=num_clients).clamp(min=1)
        metrics = {
            "cost": torch.bincount(client, weights=kcenters.power(dmin.double(), self.ell), minlength=num_clients)
            / size,
            "cost_p1": torch.bincount(client, weights=dmin.double(), minlength=num_clients) / size,
        }
        if self.score_labels:
            metrics["ari"] = per_client_ari(y, labels, client, num_clients)
        return metrics
