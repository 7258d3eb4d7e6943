"""p-FClus: personalized federated data clustering in one round trip ("Fair Federated Data Clustering through
Personalization: Bridging the Gap between Diverse Data Distributions", arXiv 2407.04302; section 4, Algorithms 1-4).

1. Every client fits k local centers to its points with the model's (k, l)-clustering (k-means for l = 2,
   k-medoids for l = 1, Lloyd with l-centers otherwise; min(k, n_z) centers) and uploads them.
2. The server runs the same (k, l)-clustering on the unweighted union of the uploaded centers: k global centers.
3. Every client personalizes ITS OWN COPY of the global centers, C^g in Algorithm 1 (the authors' released code
   chained clients through one mutated array; `chain_clients=True` reproduces that): `epochs` passes over its
   points in stored order; for each point x, with c_g its nearest current center and c_loc its nearest local center,

       c_g <- c_g - eta * [ (l/2) sign(c_g - x) |c_g - x|^(l-1) + 2 lambda (c_g - c_loc) ],

   the (sub)gradient of 1/2 ||c_g - x||_l^l + lambda ||c_g - c_loc||^2 (our correction of Eq. 5 and Eq. 7: it is
   Eq. 6 for l = 2, and for l = 1 Eq. 7 with the printed 1/2 made 1/2 sign(c_g - x) + 2 lambda (c_g - c_loc)).
   eta = eta0 / count, with a per-center count set to 0 once per client and incremented before use (Algorithm 4
   line 7), or eta0 (`eta_mode="const"`, not in the paper). For k-medoids the centers are finally snapped to the
   nearest local point.

Each client is then evaluated with its personalized centers. Every client's pass is sequential over its points,
but clients are independent, so all clients advance one point per step as one batched tensor operation
(exactly the per-client sequential result, as the tests check against a point-by-point loop of Algorithm 4).

Logged besides the personalized per-client costs: `global/*` (every client with the un-personalized global
centers) and `local/*` (every client with its own local centers), bracketing ablations (ours, not in the paper).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor

from fedlight.cluster import kcenters
from fedlight.algorithms.centroid_base import CentroidAlgorithm
from fedlight.plugin import RoundUpdates

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


def personalization_gradient(center: Tensor, x: Tensor, local: Tensor, ell: float, lam: float) -> Tensor:
    """(l/2) sign(c - x) |c - x|^(l-1) + 2 lambda (c - c_loc): (c - x) + 2 lambda (c - c_loc) for l = 2,
    1/2 sign(c - x) + 2 lambda (c - c_loc) for l = 1."""
    diff = center - x
    if ell == 2:
        data = diff
    elif ell == 1:
        data = 0.5 * torch.sign(diff)
    else:
        data = 0.5 * ell * torch.sign(diff) * diff.abs().pow(ell - 1)
    return data + 2.0 * lam * (center - local)


def _power_distances(x: Tensor, centers: Tensor, ell: float) -> Tensor:
    """(Z, k) sum_j |x_j - c_j|^l of one point per client (Z, h) to that client's centers (Z, k, h)."""
    diff = (centers - x[:, None, :]).abs()
    return (diff * diff if ell == 2 else diff if ell == 1 else diff.pow(ell)).sum(dim=-1)


def personalize(
    global_centers: Tensor,
    local_centers: Tensor,
    x: Tensor,
    bounds: list[int],
    ell: float = 2.0,
    lam: float = 0.01,
    epochs: int = 10,
    eta0: float = 1.0,
    eta_mode: str = "count",
) -> Tensor:
    """Algorithm 4 for every client at once. global_centers: (k, h) or (Z, k, h) starting centers (copied per
    client); local_centers: (Z, k, h); client z owns rows bounds[z]:bounds[z+1] of `x`, visited in that order.
    Returns the personalized centers (Z, k, h), index-aligned with the starting centers."""
    with torch.no_grad(), kcenters.small_problem_threads(local_centers.numel(), x.device):
        return _personalize(global_centers, local_centers, x, bounds, ell, lam, epochs, eta0, eta_mode)


def _personalize(
    global_centers: Tensor,
    local_centers: Tensor,
    x: Tensor,
    bounds: list[int],
    ell: float,
    lam: float,
    epochs: int,
    eta0: float,
    eta_mode: str,
) -> Tensor:
    z_count, k, h = local_centers.shape
    centers = global_centers.expand(z_count, k, h).clone().to(x.dtype)
    local = local_centers.to(x.dtype)
    bounds_t = torch.as_tensor(bounds, device=x.device)
    starts, sizes = bounds_t[:-1], bounds_t[1:] - bounds_t[:-1]
    count = torch.zeros(z_count, k, dtype=x.dtype, device=x.device)
    clients = torch.arange(z_count, device=x.device)
    longest = int(sizes.max()) if z_count else 0
    for _ in range(epochs):
        for i in range(longest):
            active = i < sizes
            xi = x[(starts + i).clamp(max=len(x) - 1)]
            nearest_local = _power_distances(xi, local, ell).argmin(dim=1)
            g = _power_distances(xi, centers, ell).argmin(dim=1)
            count[clients, g] += active.to(x.dtype)
            eta = eta0 / count[clients, g].clamp(min=1) if eta_mode == "count" else torch.full_like(count[:, 0], eta0)
            current = centers[clients, g]
            step = eta[:, None] * personalization_gradient(current, xi, local[clients, nearest_local], ell, lam)
            centers[clients, g] = torch.where(active[:, None], current - step, current)
    return centers


class PFClus(CentroidAlgorithm):
    """p-FClus (see the module doc). One round: `federation.rounds: 1`, evaluated on `eval_split: train`.

    Args:
        lam: the fine-tuning level lambda (reference code: 0.01; keep below 0.5 for a stable first step).
        epochs: passes over the client's points during personalization (reference code: 10).
        eta0: multiplier of the learning rate (1 in the paper).
        eta_mode: "count" (eta0 / running count of points the center has taken, the paper's) or "const" (eta0).
        snap: snap the personalized centers to the nearest local point; default: when the model's centers are
            medoids (k-medoids), as the paper does.
        chain_clients: start each client from the previous client's personalized centers, reproducing the
            authors' released code's in-place mutation (not in the paper); off by default.
        n_init, max_iter, tol: the (k, l)-clustering solver of the clients and the server.
    """

    def __init__(
        self,
        lam: float = 0.01,
        epochs: int = 10,
        eta0: float = 1.0,
        eta_mode: Literal["count", "const"] = "count",
        snap: bool | None = None,
        chain_clients: bool = False,
        n_init: int = 10,
        max_iter: int = 300,
        tol: float = 1e-4,
    ) -> None:
        super().__init__(n_init, max_iter, tol)
        if lam < 0 or epochs < 0 or eta0 <= 0:
            raise ValueError(f"need lam >= 0, epochs >= 0 and eta0 > 0, got {lam}, {epochs}, {eta0}")
        if eta_mode not in ("count", "const"):
            raise ValueError(f"eta_mode must be 'count' or 'const', got {eta_mode!r}")
        self.lam, self.epochs, self.eta0, self.eta_mode = lam, epochs, eta0, eta_mode
        self.snap, self.chain_clients = snap, chain_clients
        self.global_centers = torch.empty(0)

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        self.local_centers = server.state.declare("local_centers", initial=server.model.initial_params)
        self.global_centers = server.model.initial_params.clone()

    # phase 1, the clients' local (k, l)-clustering, is the inherited `local_fit`

    # -- phase 2: server -----------------------------------------------------------------------------
    def aggregate(self, round: int, updates: RoundUpdates) -> None:
        held = updates.all()
        self.local_centers.write(held.clients, held.params)
        pooled = torch.cat(self.uploads(held))
        fit = self.cluster(pooled, self.server_generator(round))
        self.global_centers = self.to_flat(fit.centers)
        self.models = self.global_centers.unsqueeze(0).clone()
        self.assignment = torch.zeros(self.server.num_clients, dtype=torch.long, device=self.server.device)

    # -- phase 3: clients personalize ----------------------------------------------------------------
    def post_aggregation(self, round: int, updates: RoundUpdates) -> None:
        self.models = self.personalized(self.global_centers)
        self.assignment = torch.arange(self.server.num_clients, device=self.server.device)

    def personalized(self, global_centers: Tensor) -> Tensor:
        """(Z, k*h) every client's personalized centers, each started from `global_centers` (flat)."""
        data = self.server.clients.split("train")
        x = self.all_points(data.x)
        local = self.centers(self.local_centers.read(torch.arange(self.server.num_clients)))
        start = self.centers(global_centers)
        kw: dict[str, Any] = dict(
            ell=self.ell, lam=self.lam, epochs=self.epochs, eta0=self.eta0, eta_mode=self.eta_mode
        )
        if self.chain_clients:
            rows = []
            for z in range(self.server.num_clients):
                lo, hi = data.bounds[z], data.bounds[z + 1]
                start = personalize(start, local[z : z + 1], x[lo:hi], [0, hi - lo], **kw)[0]
                rows.append(start)
            centers = torch.stack(rows)
        else:
            centers = personalize(start, local, x, data.bounds, **kw)
        if self.medoids if self.snap is None else self.snap:
            for z in range(self.server.num_clients):
                points = x[data.bounds[z] : data.bounds[z + 1]]
                centers[z] = points[kcenters.nearest(centers[z], points, self.ell)[1]]
        return centers.reshape(self.server.num_clients, -1).to(self.models.dtype)

    def shared_centers(self) -> Tensor:
        """The global centers before personalization (a newcomer has no personalized copy)."""
        return self.global_centers

    # -- logging and checkpoints ---------------------------------------------------------------------
    def round_metrics(self) -> dict[str, float]:
        n = self.server.num_clients
        zeros = torch.zeros(n, dtype=torch.long, device=self.server.device)
        own = torch.arange(n, device=self.server.device)
        return {
            **super().round_metrics(),
            **self.center_metrics(self.global_centers.unsqueeze(0), zeros, "global"),
            **self.center_metrics(self.local_centers.read(own), own, "local"),
        }

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global_centers": self.global_centers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.global_centers = state["global_centers"]
