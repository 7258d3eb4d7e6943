"""What the federated data-clustering algorithms (p-FClus, k-FED, MFC, CentClus) share: the model is a
`CentroidModel` (k centers as one flat vector), local fitting is a clustering of the client's points rather than
SGD (`train_client` is overridden), and two extra scores are logged every round:

- `cluster/point_ari`: the adjusted Rand index of all evaluated points pooled, each labelled by the index of
  its nearest center in its own client's model, against the data's true labels (the Gaussian ids of the Syn
  sets). The label spaces are shared across clients: the baselines give every client the same centers and
  p-FClus's personalized centers keep the index of the global center they started from.
- each client's own ARI is in the per-client metrics (`ari`, from `CentroidModel.client_metrics`), with its
  cost (`cost`, power l) and unsquared cost (`cost_p1`), so summary.json has their mean, population standard
  deviation and worst client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import Tensor

from fedlight.cluster import kcenters
from fedlight.plugin import MODEL, Algorithm, Newcomers, Plan, Updates, summarize
from fedlight.cluster.scores import clustering_scores

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext


class CentroidModule(Protocol):
    """What these methods read of their model, a `fedlight.models.CentroidModel` (`setup` checks it)."""

    num_centers: int
    dim: int
    ell: float
    medoids: bool

    def centers_of(self, flat: Tensor) -> Tensor:
        """(..., k, h) the centers of flat model vectors (..., k*h)."""
        ...

    def points(self, x: Tensor) -> Tensor:
        """Inputs as (n, h) points in the centers' dtype."""
        ...

    def client_metrics(self, outputs: Tensor, y: Tensor, client: Tensor, num_clients: int) -> dict[str, Tensor]:
        """Each client's `cost`, `cost_p1` and `ari` from the points' distances to the centers (`outputs`), their labels
        `y` and owners `client`."""
        ...


class CentroidAlgorithm(Algorithm):
    """Base of the data-clustering algorithms. Reads k, l and the medoid constraint from the model.

    Args:
        n_init: k-means++ restarts of every (k, l)-clustering (client and server).
        max_iter: Lloyd / k-medoids iterations per restart.
        tol: Lloyd's stopping tolerance, relative to the mean feature variance (as scikit-learn).
    """

    one_shot = True  # one communication round (federation.rounds must be 1)
    # local work is a clustering of the client's points, not SGD; the server clusters every uploaded center set at once
    plan = Plan(holds_updates=True, own_training=True)

    def __init__(self, n_init: int = 10, max_iter: int = 300, tol: float = 1e-4) -> None:
        super().__init__(participation=1.0)
        if n_init < 1 or max_iter < 1 or tol < 0:
            raise ValueError(f"need n_init >= 1, max_iter >= 1 and tol >= 0, got {n_init}, {max_iter}, {tol}")
        self.n_init, self.max_iter, self.tol = n_init, max_iter, tol

    # -- set-up ------------------------------------------------------------------------------------
    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        module = server.model.module
        name = type(self).__name__
        if not all(hasattr(module, a) for a in ("num_centers", "dim", "ell", "medoids", "centers_of", "points")):
            raise ValueError(
                f"{name} clusters data points: use model: fedlight.models.CentroidModel, not {type(module).__name__}"
            )
        centroids = self.centroid_module
        if server.model.num_params != centroids.num_centers * centroids.dim:
            raise ValueError(f"{name} needs a model made only of its {centroids.num_centers} x {centroids.dim} centers")
        server.cohort.needs_every_client(name, "in every round (each uploads its local clustering)")
        server.message.sends("counts", MODEL)  # how many of the centers in its flat model are real
        if self.one_shot and server.run.rounds != 1:
            raise ValueError(f"{name} is one-shot: set federation.rounds: 1 (got {server.run.rounds})")
        self.k, self.ell, self.medoids = centroids.num_centers, centroids.ell, centroids.medoids
        self.all_points(server.clients.split("train").x[:1])  # the data's feature count must match the model's dim

    @property
    def centroid_module(self) -> CentroidModule:
        """The run's model, as these methods read it (`setup` checks that it has what they read)."""
        return cast(CentroidModule, self.server.model.module)

    # -- local work ------------------------------------------------------------------------------
    def train_client(
        self, round: int, client: int, start: Tensor
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The client's local clustering (`local_fit`) on its training points, instead of SGD."""
        x = self.client_points(client)
        with kcenters.small_problem_threads(x.numel(), x.device):
            return self.local_fit(round, client, x, start)

    def local_fit(
        self, round: int, client: int, x: Tensor, start: Tensor
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, dict[str, Tensor]]:
        """(the client's fitted flat model, its mean cost per point[, what it sends beside them]) from its points `x`
        (n, h). The default is the model's (k, l)-clustering, seeded by (run seed, round, client)."""
        fit = self.cluster(x, self.generator(self.server.random.client_seed(round, client)))
        return self.fitted(fit, x)

    def fitted(self, fit: kcenters.CenterFit, x: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """A local fit as the client sends it: (its centers as a flat model, its mean cost per point, {"counts": how
        many of the centers are its own, the rest being padding})."""
        return (
            self.to_flat(fit.centers),
            torch.tensor(fit.cost / len(x), device=x.device),
            {"counts": torch.tensor(len(fit.centers), device=x.device)},
        )

    # -- services ----------------------------------------------------------------------------------
    def client_points(self, client: int, split: str = "train") -> Tensor:
        """A client's points as an (n, h) matrix (the data module's batch conversion applied, flattened)."""
        x, _ = self.server.clients.split(split).client(client)
        return self.all_points(x)

    def all_points(self, x: Tensor) -> Tensor:
        """Raw samples as an (n, h) matrix of points, as the model sees them."""
        return self.centroid_module.points(self.server.data.inputs(x))

    def generator(self, seed: int) -> torch.Generator:
        """The CPU generator of `seed` the clusterings draw from (`kcenters.generator_for`), so a run clusters alike on
        a CPU and a GPU."""
        return kcenters.generator_for(seed)

    def server_generator(self, round: int, purpose: str = "server") -> torch.Generator:
        """A generator for the server's clustering in round `round`, seeded from the run's (round, `purpose`) stream."""
        return self.generator(int(self.server.random.rng(round, purpose).integers(2**62)))

    def cluster(
        self, x: Tensor, generator: torch.Generator, weights: Tensor | None = None, k: int | None = None
    ) -> kcenters.CenterFit:
        """The model's (k, l)-clustering of `x` with this algorithm's solver settings."""
        return kcenters.fit(
            x, k or self.k, self.ell, self.medoids, weights, self.n_init, self.max_iter, self.tol, generator
        )

    def to_flat(self, centers: Tensor) -> Tensor:
        """A flat model vector from up to k centers (fewer are padded by repetition)."""
        return kcenters.pad_centers(centers, self.k).reshape(-1).to(self.models.dtype)

    def centers(self, flat: Tensor) -> Tensor:
        """(..., k, h) the centers of flat models (..., k*h)."""
        return self.centroid_module.centers_of(flat)

    def uploads(self, updates: Updates) -> list[Tensor]:
        """Each client's uploaded centers without padding (in the order of the updates)."""
        return [c[:count] for c, count in zip(self.centers(updates.params), updates.state["counts"].tolist())]

    @torch.no_grad()
    def labels_and_metrics(
        self, models: Tensor | Sequence[Tensor], group_of_client: Tensor, split: str | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Every evaluated point's nearest-center index under its client's model, and the module's per-client
        metrics, for any (models, group of each client) pair like `evaluation_models()`."""
        split = split or self.server.run.eval_split
        data, client = self.server.clients.split(split), self.server.clients.client_of_row(split)
        points = self.all_points(data.x)
        outputs = torch.empty(len(points), self.k, dtype=points.dtype, device=points.device)
        group_of_row = group_of_client[client]
        order = torch.argsort(group_of_row, stable=True)
        counts = torch.bincount(group_of_row, minlength=len(models)).tolist()
        with kcenters.small_problem_threads(points.numel(), points.device):
            begin = 0
            for group, count in enumerate(counts):
                if count:
                    rows = order[begin : begin + count]
                    outputs[rows] = kcenters.distances(points[rows], self.centers(models[group]), self.ell)
                    begin += count
            metrics = self.centroid_module.client_metrics(outputs, data.y, client, self.server.num_clients)
        return outputs.argmin(dim=1), metrics

    def center_metrics(self, models: Tensor, group_of_client: Tensor, prefix: str) -> dict[str, float]:
        """Mean / std / worst client of the per-client metrics of a center set (e.g. an ablation)."""
        _, metrics = self.labels_and_metrics(models, group_of_client)
        metrics.pop("ari", None)
        return summarize({k: v.cpu().numpy() for k, v in metrics.items()}, prefix)

    # -- newcomers ---------------------------------------------------------------------------------
    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, None]:
        """Every newcomer gets the server's centers (`shared_centers`): each of its points goes to the nearest
        one. It has no personalized copy of its own, and these methods cluster points, not clients."""
        groups = torch.zeros(newcomers.count, dtype=torch.long, device=self.models.device)
        return self.shared_centers().unsqueeze(0), groups, None

    def shared_centers(self) -> Tensor:
        """The flat center set the server holds for every client (the one global model)."""
        return self.models[0]

    # -- logging -----------------------------------------------------------------------------------
    def round_metrics(self) -> dict[str, float]:
        if not getattr(self.server.model.module, "score_labels", False):
            return {}
        models, groups = self.evaluation_models()
        # flat models: these methods give no predictor of their own
        labels, _ = self.labels_and_metrics(cast("Tensor | Sequence[Tensor]", models), groups)
        true = self.server.clients.split(self.server.run.eval_split).y
        if len(true) == 0:
            return {}
        return {"cluster/point_ari": clustering_scores(true.cpu().numpy(), labels.cpu().numpy())["ari"]}
