"""PACFL (Vahidian, Morafah, Wang, Kungurtsev, Chen, Shah, Lin: "Efficient Distribution Similarity Identification in
Clustered Federated Learning via Principal Angles Between Client Data Subspaces", AAAI 2023; the proposed method's
section and its Algorithm 1).

Before training, every client sends the server once an orthonormal basis U_k of the top-p left singular vectors of
its data matrix D_k (one column per training sample, flattened). The server builds the proximity matrix A[i, j] =
the smallest principal angle between span(U_i) and span(U_j), in degrees, clusters it hierarchically (agglomerative,
a distance threshold on the linkage or a cluster count), and runs FedAvg within each cluster from the initial model.
The principal angles of two bases are the arccosines of the singular values of U_i^T U_j.

Defaults: D_k holds the raw data as the data module stores it (uint8 pixels, say), before the model's per-batch
conversion, as the authors' code takes each client's `dataset.data` array; `inputs: model` takes the samples as the
model sees them instead. A scale (pixels / 255) leaves the left singular vectors as they are, a shift does not (the
normalization's mean: the span of the points x - mu is not that of x), so the angles, and the threshold that
separates them, differ between the two (the digits are stored as the model sees them: the same there). p = 3 and
average linkage, the authors' released scripts' `n_basis` and `linkage`; the threshold of 4.9 degrees is their
CIFAR-10 script's; the paper tunes it per data set, and a config should too (the proximity matrix is logged as
`principal_angle_proximity` in round 1 to choose it).

Deviations:
- one truncated SVD of the client's whole data matrix, as the method section states it; the authors' code takes one
  per class and stacks the bases (a label-skew refinement, not used here);
- the principal angles are exact (SVD of U_i^T U_j); the authors' code approximates the smallest one by the
  smallest arccos of the entries of U_i^T U_j;
- the linkages are scikit-learn's (average = UPGMA); the authors' own loop averages the two merged rows (WPGMA),
  and merges at a distance equal to the threshold, where scikit-learn stops.

A client that arrives after training sends its basis too, and joins the cluster at the smallest linkage distance
from it: the mean (average), largest (complete) or smallest (single) principal angle to the cluster's members.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from torch import Tensor

from fedlight.cluster.clusterers import Agglomerative, linkage_to_clusters
from fedlight.plugin import Algorithm, ClientSplit, Newcomers

if TYPE_CHECKING:
    from fedlight.plugin import ServerContext

Linkage = Literal["average", "complete", "single"]


def data_subspace(x: Tensor, p: int) -> Tensor:
    """(features, p) orthonormal basis of the top-p left singular vectors of the data matrix whose columns are the
    samples `x` flattened (fewer columns when there are fewer samples or features), in float64."""
    matrix = x.flatten(1).to(torch.float64).T
    return torch.linalg.svd(matrix, full_matrices=False)[0][:, :p].contiguous()  # a copy: not a view of all of U


def principal_angles(u1: Tensor, u2: Tensor) -> Tensor:
    """The principal angles between span(u1) and span(u2) (orthonormal columns), in degrees, smallest first:
    arccos of the singular values of u1^T u2."""
    cosines = torch.linalg.svdvals(u1.T @ u2).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.arccos(cosines))


def stacked_bases(bases: Iterable[Tensor], count: int, p: int) -> Tensor:
    """(count, features, p) the `count` bases side by side, each written in as it comes (one at a time in memory), a
    basis with fewer than p columns padded with zero columns (which add zero singular values to every U_i^T U_j and
    leave the largest, the smallest angle's cosine, unchanged)."""
    out: Tensor | None = None
    for k, basis in enumerate(bases):
        if out is None:
            out = torch.zeros(count, basis.shape[0], p, dtype=torch.float64)
        out[k, :, : basis.shape[1]] = basis
    return torch.zeros(0, 0, p, dtype=torch.float64) if out is None else out


#: bytes of the (rows, columns, p, p) block of U_i^T U_j that `smallest_angles` holds at once (about 4x in all, with
#: the GEMM's output, its transposed copy and svdvals' work)
BLOCK_BYTES = 2**26


def smallest_angles(bases: Tensor, others: Tensor | None = None, block_bytes: int = BLOCK_BYTES) -> Tensor:
    """(n, m) the smallest principal angle, in degrees, between every basis of `bases` (n, features, p) and every
    one of `others` (m, features, q); `others` None: `bases` against themselves, each pair once (i < j), symmetric
    with a zero diagonal. A chunk of rows at a time: one GEMM of its stacked bases against all of `others`, then
    batched svdvals of the (p, q) blocks U_i^T U_j; a chunk's block is at most about `block_bytes`."""
    symmetric = others is None
    others = bases if others is None else others
    n, features, p = bases.shape
    m, q = others.shape[0], others.shape[2]
    columns = others.permute(1, 0, 2).reshape(features, m * q)  # U_1 | U_2 | ... | U_m
    out = torch.zeros(n, m, dtype=torch.float64)
    rows = max(1, block_bytes // max(1, m * p * q * 8))
    for start in range(0, n, rows):
        stop, first = min(n, start + rows), start if symmetric else 0
        gram = bases[start:stop].transpose(1, 2).reshape(-1, features) @ columns[:, first * q :]
        blocks = gram.reshape(stop - start, p, m - first, q).transpose(1, 2)  # (rows, columns, p, q): U_i^T U_j
        cosines = torch.linalg.svdvals(blocks)[..., 0] if p and q else blocks.new_zeros(blocks.shape[:2])
        out[start:stop, first:] = torch.rad2deg(torch.arccos(cosines.clamp(-1.0, 1.0)))
    if symmetric:
        upper = out.triu(1)
        out = upper + upper.T
    return out


class PACFL(Algorithm):
    """One-shot clustering of the clients by the principal angles between their data subspaces, then FedAvg per
    cluster.

    Args:
        basis_size: p, the left singular vectors each client sends.
        threshold: the linkage distance (degrees) at or above which clusters are not merged.
        num_clusters: a cluster count instead of the threshold (give one of the two).
        linkage: "average", "complete" or "single".
        inputs: the data each subspace is taken of: "raw" (as the data module stores it, the authors' way) or
            "model" (converted as the model sees it: normalized).
        participation: share of clients per round.
    """

    def __init__(
        self,
        basis_size: int = 3,
        threshold: float | None = 4.9,
        num_clusters: int | None = None,
        linkage: Linkage = "average",
        inputs: Literal["raw", "model"] = "raw",
        participation: float = 1.0,
    ) -> None:
        super().__init__(participation)
        if basis_size < 1:
            raise ValueError(f"basis_size must be >= 1, got {basis_size}")
        if inputs not in ("raw", "model"):
            raise ValueError(f"algorithm.init_args.inputs must be raw or model, got {inputs!r}")
        if num_clusters is not None:
            threshold = None  # a count replaces the default threshold
        if threshold is None and num_clusters is None:
            raise ValueError("PACFL needs algorithm.init_args.threshold (degrees) or algorithm.init_args.num_clusters")
        self.clusterer = Agglomerative(num_clusters, threshold, linkage)
        self.basis_size, self.num_clusters, self.linkage, self.inputs = basis_size, num_clusters, linkage, inputs
        self.proximity = torch.empty(0)  # (n, n) smallest principal angles, degrees
        self.bases = torch.empty(0, 0, basis_size, dtype=torch.float64)  # (n, features, p) every client's basis

    def setup(self, server: ServerContext) -> None:
        super().setup(server)
        if self.num_clusters is not None and self.num_clusters > server.num_clients:
            raise ValueError(
                f"algorithm.init_args.num_clusters is {self.num_clusters}, more than the "
                f"{server.num_clients} clients: give at most {server.num_clients}"
            )
        server.cohort.declare_every_client_work(
            "every client sends its data subspace once, before round 1, and the server compares every pair"
        )
        self.bases = self.client_bases(server.clients.split("train"), server.num_clients)
        self.proximity = smallest_angles(self.bases)
        labels = self.clusterer.fit_predict(self.proximity.numpy(), kind="distance")
        self.assignment = torch.as_tensor(labels, device=server.device)
        self.models = server.model.initial_params.repeat(int(labels.max()) + 1, 1)

    def client_bases(self, split: ClientSplit, count: int) -> Tensor:
        """(count, features, p) every client's basis from its samples of `split`, raw or converted as the model sees
        them (`inputs`)."""
        return stacked_bases(
            (data_subspace(self.subspace_data(split.client(k)[0]), self.basis_size) for k in range(count)),
            count,
            self.basis_size,
        )

    def subspace_data(self, x: Tensor) -> Tensor:
        """A client's samples as its subspace is taken of them: raw, or as the model sees them."""
        return self.server.data.inputs(x) if self.inputs == "model" else x

    def begin_round(self, round: int) -> None:
        if round == 1:  # the one clustering, recorded with the first round
            self.log_matrix("principal_angle_proximity", self.proximity)

    def newcomer_models(self, newcomers: Newcomers) -> tuple[Tensor, Tensor, Tensor]:
        """Each newcomer joins the cluster at the smallest linkage distance from its basis."""
        bases = self.client_bases(newcomers.split("train"), newcomers.count)
        distances = linkage_to_clusters(smallest_angles(bases, self.bases).numpy(), self.cluster_labels(), self.linkage)
        groups = torch.as_tensor(distances.argmin(axis=1), device=self.models.device)
        return self.models, groups, groups

    def cluster_labels(self) -> np.ndarray:
        return self.assignment.cpu().numpy()
