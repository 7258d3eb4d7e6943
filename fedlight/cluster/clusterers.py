"""Interchangeable clustering components on a precomputed n x n client matrix (scikit-learn convention).

Every component has `fit_predict(matrix, kind=None) -> np.ndarray` of integer labels 0..k-1, numbered in order
of first appearance. A component declares the kind of matrix its algorithm consumes (`input_kind`,
"distance" or "similarity"); give it the other kind by saying so (`kind="similarity"`) and it is converted:

- similarity -> distance: D = 1 - S. This covers cosine similarity in [-1, 1] (D = cosine distance in [0, 2],
  the divergence matrix of one-shot clustered FL) and agreement-type similarities in [0, 1] (D in [0, 1]).
  Similarities must be <= 1; other scales should be converted by the caller and passed as distances.
- distance -> similarity: S = 1 - D, the inverse map. Affinity propagation (the only similarity consumer) is
  invariant to adding a constant to all similarities when the preference is the median, so this is the same
  as sklearn's "negative distance" convention.

By default the matrix is also checked for looking like the other kind (a distance has a zero diagonal, a
similarity a diagonal at its maximum), which catches passing distances where similarities are expected
(the one-shot clustered FL code fed its distance matrix to affinity propagation as similarities). Pass
`validate=False` to skip the check, e.g. to reproduce that behaviour on purpose.

Density methods (HDBSCAN, DBSCAN) and a non-converged affinity propagation mark points as noise (-1). The
`noise` policy decides what they become: "own_cluster" (all noise points form one extra cluster, as the
one-shot clustered FL code does), "singletons" (one cluster per noise point), "nearest" (the cluster of the
closest non-noise point by the distance matrix), "nearest_mean" (the cluster with the lowest mean distance) or
"keep" (leave -1). With "nearest"/"nearest_mean" and no non-noise point at all, everything is one cluster.
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Literal

import numpy as np
import sklearn.cluster as skc
import torch

Kind = Literal["distance", "similarity"]
NOISE_POLICIES = ("own_cluster", "singletons", "nearest", "nearest_mean", "keep")
_KINDS = ("distance", "similarity")


# ----------------------------------------------------------------------------- matrix checks and conversions


def as_square_matrix(matrix: Any, atol: float = 1e-5) -> np.ndarray:
    """A float64 numpy copy of a square, finite, (near-)symmetric matrix, symmetrized exactly."""
    if isinstance(matrix, torch.Tensor):
        matrix = matrix.detach().cpu().double().numpy()
    M = np.array(matrix, dtype=np.float64, copy=True)
    if M.ndim != 2 or M.shape[0] != M.shape[1]:
        raise ValueError(f"expected a square (n, n) matrix, got shape {M.shape}")
    if M.shape[0] == 0:
        raise ValueError("expected at least one client (the matrix is empty)")
    if not np.isfinite(M).all():
        raise ValueError("the matrix contains NaN or infinite values")
    scale = max(1.0, float(np.abs(M).max()))
    if np.abs(M - M.T).max() > atol * scale:
        raise ValueError("the matrix is not symmetric; pairwise distances/similarities must be symmetric")
    return 0.5 * (M + M.T)


def _check_kind(M: np.ndarray, kind: str, atol: float = 1e-6) -> None:
    """Raise when a matrix obviously is the other kind than declared (only meaningful for n >= 2)."""
    n = M.shape[0]
    if n < 2:
        return
    diag, off = np.diag(M), M[~np.eye(n, dtype=bool)]
    if kind == "similarity" and np.all(np.abs(diag) <= atol) and off.min() >= -atol and off.max() > atol:
        raise ValueError(
            "declared a similarity matrix, but it has a zero diagonal and non-negative entries: it "
            "looks like a distance matrix. Pass kind='distance' (or validate=False to use it as is)"
        )
    if kind == "distance" and np.all(diag > atol) and np.allclose(diag, diag[0]) and diag[0] >= off.max() - atol:
        raise ValueError(
            "declared a distance matrix, but its diagonal is constant, non-zero and maximal: it "
            "looks like a similarity matrix. Pass kind='similarity' (or validate=False to use it as is)"
        )


def to_distance(matrix: Any, kind: Kind = "distance", validate: bool = True) -> np.ndarray:
    """The distance form of a distance or similarity matrix (D = 1 - S for similarities <= 1), zero diagonal."""
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    M = as_square_matrix(matrix)
    if validate:
        _check_kind(M, kind)
    if kind == "similarity":
        if M.max() > 1.0 + 1e-6:
            raise ValueError(
                f"similarities must be <= 1 (cosine in [-1, 1] or agreement in [0, 1]); the maximum is "
                f"{M.max():.4g}. Convert other scales to a distance yourself and pass kind='distance'"
            )
        M = 1.0 - M
    if M.min() < -1e-6:
        raise ValueError(f"distances must be non-negative, the minimum is {M.min():.4g}")
    M = np.clip(M, 0.0, None)
    np.fill_diagonal(M, 0.0)
    return M


def to_similarity(matrix: Any, kind: Kind = "similarity", validate: bool = True) -> np.ndarray:
    """The similarity form of a distance or similarity matrix (S = 1 - D for distances)."""
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
    if kind == "distance":
        return 1.0 - to_distance(matrix, "distance", validate)
    M = as_square_matrix(matrix)
    if validate:
        _check_kind(M, "similarity")
    return M


def classical_mds(distance: np.ndarray, n_components: int | None = None) -> np.ndarray:
    """Classical (Torgerson) MDS: points whose Euclidean distances best match `distance` (n, n) -> (n, k).

    B = -½ J D² J with J the centring matrix; coordinates are the eigenvectors of the positive eigenvalues
    scaled by their square roots. `n_components=None` keeps every positive eigenvalue.
    """
    D = np.asarray(distance, dtype=np.float64)
    n = D.shape[0]
    J = np.eye(n) - 1.0 / n
    B = -0.5 * J @ (D**2) @ J
    vals, vecs = np.linalg.eigh(0.5 * (B + B.T))
    order = np.argsort(vals)[::-1]
    vals, vecs = vals[order], vecs[:, order]
    keep = vals > 1e-10 * max(1.0, abs(vals[0]))
    if n_components is not None:
        keep &= np.arange(n) < n_components
    if not keep.any():  # all points coincide
        return np.zeros((n, 1))
    return vecs[:, keep] * np.sqrt(vals[keep])


# ----------------------------------------------------------------------------- labels: noise and renaming


def relabel(labels: np.ndarray) -> np.ndarray:
    """Rename labels to 0..k-1 in order of first appearance; -1 (noise) stays -1."""
    labels = np.asarray(labels)
    out = np.full(labels.shape, -1, dtype=np.int64)
    mapping: dict[int, int] = {}
    for i, lab in enumerate(labels.tolist()):
        if lab == -1:
            continue
        out[i] = mapping.setdefault(lab, len(mapping))
    return out


def linkage_to_clusters(distances: np.ndarray, labels: np.ndarray, linkage: str = "average") -> np.ndarray:
    """(m, k) linkage distance from each of m new points to each of the k clusters of a clustering, given the
    points' (m, n) distances to its n members and the members' labels 0..k-1: the mean ("average"), largest
    ("complete") or smallest ("single") distance to the cluster's members, as agglomerative clustering would
    measure a merge of the point with the cluster (to place a client that arrives after the clustering)."""
    reduce: dict[str, Callable[..., np.ndarray]] = {"average": np.mean, "complete": np.max, "single": np.min}
    if linkage not in reduce:
        raise ValueError(f"linkage must be one of {tuple(reduce)}, got {linkage!r}")
    distances, labels = np.asarray(distances, dtype=np.float64), np.asarray(labels)
    return np.stack([reduce[linkage](distances[:, labels == k], axis=1) for k in range(int(labels.max()) + 1)], axis=1)


def resolve_noise(labels: np.ndarray, distance: np.ndarray, policy: str = "own_cluster") -> np.ndarray:
    """Replace noise labels (-1) according to `policy` (see the module docstring), then `relabel`.

    `distance` is any (n, n) dissimilarity (smaller is closer); "nearest" and "nearest_mean" only compare it.
    """
    if policy not in NOISE_POLICIES:
        raise ValueError(f"noise must be one of {NOISE_POLICIES}, got {policy!r}")
    labels = np.asarray(labels, dtype=np.int64).copy()
    noise = labels == -1
    if policy == "keep" or not noise.any():
        return relabel(labels)
    fresh = int(labels.max()) + 1 if (~noise).any() else 0
    if policy == "own_cluster" or (policy in ("nearest", "nearest_mean") and noise.all()):
        labels[noise] = fresh
    elif policy == "singletons":
        labels[noise] = fresh + np.arange(int(noise.sum()))
    elif policy == "nearest":
        core = np.flatnonzero(~noise)
        nearest = core[np.argmin(distance[np.ix_(noise, core)], axis=1)]
        labels[noise] = labels[nearest]
    else:  # nearest_mean
        clusters = np.unique(labels[~noise])
        means = np.stack([distance[np.ix_(noise, labels == c)].mean(axis=1) for c in clusters], axis=1)
        labels[noise] = clusters[np.argmin(means, axis=1)]
    return relabel(labels)


# ----------------------------------------------------------------------------- components


class Clusterer:
    """Base class: converts the matrix to `input_kind`, runs `_fit` and applies the noise policy.

    Subclasses set `input_kind` and implement `_fit(matrix) -> raw labels` on a float64 numpy matrix of that
    kind (with n >= 2). After `fit_predict`, `labels_` holds the labels and `n_clusters_` their count.
    """

    input_kind: ClassVar[Kind] = "distance"

    def __init__(self, noise: str = "own_cluster") -> None:
        if noise not in NOISE_POLICIES:
            raise ValueError(f"noise must be one of {NOISE_POLICIES}, got {noise!r}")
        self.noise = noise

    def fit_predict(self, matrix: Any, kind: Kind | None = None, validate: bool = True) -> np.ndarray:
        """Cluster the clients of an (n, n) matrix (numpy or torch) of the given `kind` (default `input_kind`)."""
        kind = self.input_kind if kind is None else kind
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
        if self.input_kind == "distance":
            X = to_distance(matrix, kind, validate)
            dissimilarity = X
        else:
            X = to_similarity(matrix, kind, validate)
            dissimilarity = -X  # noise policies only compare dissimilarities, so any decreasing map will do
        raw = np.zeros(1, dtype=np.int64) if X.shape[0] == 1 else self._fit(X)
        self.labels_ = resolve_noise(np.asarray(raw, dtype=np.int64), dissimilarity, self.noise)
        self.n_clusters_ = len(set(self.labels_.tolist()) - {-1})
        return self.labels_

    def _fit(self, matrix: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.endswith("_"))
        return f"{type(self).__name__}({args})"


def _embed(distance: np.ndarray, embedding: str, n_components: int | None) -> np.ndarray:
    if embedding == "rows":
        return distance
    return classical_mds(distance, n_components)


def _check_embedding(embedding: str) -> None:
    if embedding not in ("rows", "mds"):
        raise ValueError(f"embedding must be 'rows' or 'mds', got {embedding!r}")


class HDBSCAN(Clusterer):
    """HDBSCAN on a precomputed distance matrix (the `hdbscan` package, float64 input).

    `min_cluster_size` is a count (int >= 2) or a fraction of n in (0, 1): ceil(fraction * n), at least 2
    (one-shot clustered FL uses 20 % of the clients: 3 for n = 15, 6 for n = 30). `min_samples=None` means
    min_cluster_size. `backend="sklearn"` uses `sklearn.cluster.HDBSCAN` instead (what that paper's code ran).

    `min_samples` counts the point itself, as sklearn's HDBSCAN (and so OCFL's code) counts it. The hdbscan package
    counts the neighbours without it, so it is given one less: both backends then cluster alike. Given as it is, a
    cluster of exactly min_cluster_size clients (4 rotations of 4 clients, min_cluster_size 20 % of 16) had no core
    point and every client came back as noise (tests/unit/test_clustering.py).
    """

    input_kind = "distance"

    def __init__(
        self,
        min_cluster_size: int | float = 0.2,
        min_samples: int | None = None,
        cluster_selection_method: str = "eom",
        cluster_selection_epsilon: float = 0.0,
        allow_single_cluster: bool = False,
        backend: str = "hdbscan",
        noise: str = "own_cluster",
    ) -> None:
        super().__init__(noise)
        if isinstance(min_cluster_size, bool) or not isinstance(min_cluster_size, (int, float)):
            raise TypeError(f"min_cluster_size must be an int >= 2 or a fraction in (0, 1), got {min_cluster_size!r}")
        if isinstance(min_cluster_size, float) and not 0.0 < min_cluster_size < 1.0:
            raise ValueError(f"a fractional min_cluster_size must lie in (0, 1), got {min_cluster_size}")
        if isinstance(min_cluster_size, int) and min_cluster_size < 2:
            raise ValueError(f"min_cluster_size must be >= 2, got {min_cluster_size}")
        if min_samples is not None and min_samples < 1:
            raise ValueError(f"min_samples must be >= 1 or None, got {min_samples}")
        if cluster_selection_method not in ("eom", "leaf"):
            raise ValueError(f"cluster_selection_method must be 'eom' or 'leaf', got {cluster_selection_method!r}")
        if backend not in ("hdbscan", "sklearn"):
            raise ValueError(f"backend must be 'hdbscan' or 'sklearn', got {backend!r}")
        self.min_cluster_size = min_cluster_size
        self.min_samples = min_samples
        self.cluster_selection_method = cluster_selection_method
        self.cluster_selection_epsilon = cluster_selection_epsilon
        self.allow_single_cluster = allow_single_cluster
        self.backend = backend

    def resolved_min_cluster_size(self, n: int) -> int:
        """The integer min_cluster_size used for n clients."""
        if isinstance(self.min_cluster_size, float):
            return max(2, math.ceil(self.min_cluster_size * n))
        return self.min_cluster_size

    def _fit(self, matrix: np.ndarray) -> np.ndarray:
        n = matrix.shape[0]
        size = self.resolved_min_cluster_size(n)
        if size > n:
            raise ValueError(f"min_cluster_size={size} exceeds the number of clients ({n})")
        kwargs = dict(
            min_cluster_size=size,
            min_samples=self.min_samples,
            metric="precomputed",
            cluster_selection_method=self.cluster_selection_method,
            cluster_selection_epsilon=float(self.cluster_selection_epsilon),
            allow_single_cluster=self.allow_single_cluster,
        )
        if self.backend == "hdbscan":
            import hdbscan

            neighbours = (self.min_samples or size) - 1  # the package does not count the point itself
            kwargs["min_samples"] = max(1, neighbours)
            return hdbscan.HDBSCAN(**kwargs).fit_predict(matrix.astype(np.float64))
        return skc.HDBSCAN(copy=True, **kwargs).fit_predict(matrix)


class DBSCAN(Clusterer):
    """DBSCAN on a precomputed distance matrix (sklearn). `min_samples` counts the point itself."""

    input_kind = "distance"

    def __init__(self, eps: float = 0.5, min_samples: int = 5, noise: str = "own_cluster") -> None:
        super().__init__(noise)
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if int(min_samples) != min_samples or min_samples < 1:
            raise ValueError(f"min_samples must be a positive integer, got {min_samples}")
        self.eps = eps
        self.min_samples = int(min_samples)

    def _fit(self, matrix: np.ndarray) -> np.ndarray:
        return skc.DBSCAN(eps=self.eps, min_samples=self.min_samples, metric="precomputed").fit_predict(matrix)


class Agglomerative(Clusterer):
    """Agglomerative (hierarchical) clustering on a precomputed distance matrix (sklearn).

    Give exactly one of `n_clusters` and `distance_threshold`. With a threshold, clusters whose linkage
    distance is >= the threshold are not merged (sklearn's rule). Ward linkage needs Euclidean features and is
    not available on a precomputed matrix.
    """

    input_kind = "distance"
    LINKAGES = ("average", "complete", "single")

    def __init__(
        self,
        n_clusters: int | None = None,
        distance_threshold: float | None = None,
        linkage: str = "average",
        noise: str = "own_cluster",
    ) -> None:
        super().__init__(noise)
        if linkage not in self.LINKAGES:
            hint = " (ward needs Euclidean features, not a precomputed matrix)" if linkage == "ward" else ""
            raise ValueError(f"linkage must be one of {self.LINKAGES}, got {linkage!r}{hint}")
        if (n_clusters is None) == (distance_threshold is None):
            raise ValueError("give exactly one of n_clusters and distance_threshold")
        if n_clusters is not None and n_clusters < 1:
            raise ValueError(f"n_clusters must be >= 1, got {n_clusters}")
        if distance_threshold is not None and distance_threshold < 0:
            raise ValueError(f"distance_threshold must be >= 0, got {distance_threshold}")
        self.n_clusters = n_clusters
        self.distance_threshold = distance_threshold
        self.linkage = linkage

    def _fit(self, matrix: np.ndarray) -> np.ndarray:
        n_clusters = None if self.n_clusters is None else min(self.n_clusters, matrix.shape[0])
        model = skc.AgglomerativeClustering(
            n_clusters=n_clusters,
            distance_threshold=self.distance_threshold,
            metric="precomputed",
            linkage=self.linkage,
        )
        return model.fit_predict(matrix)


class KMeans(Clusterer):
    """k-means (sklearn) on an embedding of the distance matrix.

    `embedding="rows"` (default) uses row i of the distance matrix as client i's feature vector in R^n, as the
    one-shot clustered FL code does (its KMeans baseline); rows of D and of S = 1 - D give the same clusters.
    `embedding="mds"` uses classical MDS coordinates instead, which is the principled choice when the matrix
    is Euclidean-like. `n_clusters` is required.
    """

    input_kind = "distance"

    def __init__(
        self,
        n_clusters: int,
        embedding: str = "rows",
        n_components: int | None = None,
        n_init: int = 10,
        random_state: int | None = 0,
        noise: str = "own_cluster",
    ) -> None:
        super().__init__(noise)
        if n_clusters is None or n_clusters < 1:
            raise ValueError(f"n_clusters must be >= 1, got {n_clusters}")
        _check_embedding(embedding)
        self.n_clusters = n_clusters
        self.embedding = embedding
        self.n_components = n_components
        self.n_init = n_init
        self.random_state = random_state

    def _fit(self, matrix: np.ndarray) -> np.ndarray:
        X = _embed(matrix, self.embedding, self.n_components)
        k = min(self.n_clusters, matrix.shape[0])
        return skc.KMeans(n_clusters=k, n_init=self.n_init, random_state=self.random_state).fit_predict(X)


class MeanShift(Clusterer):
    """Mean-shift (sklearn) on an embedding of the distance matrix ("rows" as in KMeans, or "mds").

    `bandwidth=None` estimates it with `sklearn.cluster.estimate_bandwidth(X, quantile)` (sklearn's default,
    quantile 0.3, is what the one-shot clustered FL code used).
    """

    input_kind = "distance"

    def __init__(
        self,
        bandwidth: float | None = None,
        quantile: float = 0.3,
        embedding: str = "rows",
        n_components: int | None = None,
        cluster_all: bool = True,
        noise: str = "own_cluster",
    ) -> None:
        super().__init__(noise)
        if bandwidth is not None and not bandwidth > 0:
            raise ValueError(f"bandwidth must be > 0 or None, got {bandwidth}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must lie in (0, 1], got {quantile}")
        _check_embedding(embedding)
        self.bandwidth = bandwidth
        self.quantile = quantile
        self.embedding = embedding
        self.n_components = n_components
        self.cluster_all = cluster_all

    def _fit(self, matrix: np.ndarray) -> np.ndarray:
        X = _embed(matrix, self.embedding, self.n_components)
        bandwidth = self.bandwidth
        if bandwidth is None:
            bandwidth = skc.estimate_bandwidth(X, quantile=self.quantile)
            if not bandwidth > 0:  # all points coincide
                return np.zeros(matrix.shape[0], dtype=np.int64)
        return skc.MeanShift(bandwidth=bandwidth, cluster_all=self.cluster_all).fit_predict(X)


class AffinityPropagation(Clusterer):
    """Affinity propagation (sklearn, affinity="precomputed") on a similarity matrix.

    `preference=None` is sklearn's median similarity. A distance matrix is converted with S = 1 - D when passed
    with `kind="distance"`. A run that does not converge labels every point -1, handled by the noise policy.
    """

    input_kind = "similarity"

    def __init__(
        self,
        damping: float = 0.5,
        preference: float | None = None,
        max_iter: int = 200,
        convergence_iter: int = 15,
        random_state: int | None = 0,
        noise: str = "own_cluster",
    ) -> None:
        super().__init__(noise)
        if not 0.5 <= damping < 1.0:
            raise ValueError(f"damping must lie in [0.5, 1), got {damping}")
        self.damping = damping
        self.preference = preference
        self.max_iter = max_iter
        self.convergence_iter = convergence_iter
        self.random_state = random_state

    def _fit(self, matrix: np.ndarray) -> np.ndarray:
        model = skc.AffinityPropagation(
            affinity="precomputed",
            damping=self.damping,
            preference=self.preference,
            max_iter=self.max_iter,
            convergence_iter=self.convergence_iter,
            random_state=self.random_state,
        )
        return model.fit_predict(matrix)


# ----------------------------------------------------------------------------- registry

CLUSTERERS: dict[str, type[Clusterer]] = {
    "hdbscan": HDBSCAN,
    "dbscan": DBSCAN,
    "agglomerative": Agglomerative,
    "kmeans": KMeans,
    "affinity_propagation": AffinityPropagation,
    "mean_shift": MeanShift,
}


def register_clusterer(name: str) -> Callable[[type[Clusterer]], type[Clusterer]]:
    """Class decorator adding a `Clusterer` subclass to the registry under `name`."""

    def add(cls: type[Clusterer]) -> type[Clusterer]:
        if not (isinstance(cls, type) and issubclass(cls, Clusterer)):
            raise TypeError(f"{cls!r} is not a Clusterer subclass")
        CLUSTERERS[name.lower()] = cls
        return cls

    return add


def make_clusterer(name: str, **kwargs: Any) -> Clusterer:
    """Build a registered clustering component by name, e.g. `make_clusterer("hdbscan", min_cluster_size=0.2)`."""
    key = name.lower().replace("-", "_")
    if key not in CLUSTERERS:
        raise ValueError(f"unknown clustering algorithm {name!r}; choose one of {sorted(CLUSTERERS)}")
    return CLUSTERERS[key](**kwargs)
