"""Clustering components on precomputed matrices: block recovery, kind conversion, noise policies, validation."""

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from fedlight.cluster.clusterers import (
    CLUSTERERS,
    DBSCAN,
    HDBSCAN,
    AffinityPropagation,
    Agglomerative,
    Clusterer,
    KMeans,
    MeanShift,
    classical_mds,
    make_clusterer,
    register_clusterer,
    relabel,
    resolve_noise,
    to_distance,
    to_similarity,
)

TRUE = np.repeat(np.arange(3), 5)


def block_distance(seed: int = 0) -> np.ndarray:
    """3 blocks of 5 clients: distances ~0.1 inside a block, ~0.9 across, small symmetric noise, zero diagonal."""
    rng = np.random.default_rng(seed)
    D = np.where(TRUE[:, None] == TRUE[None, :], 0.1, 0.9) + rng.uniform(0, 0.05, (15, 15))
    D = 0.5 * (D + D.T)
    np.fill_diagonal(D, 0.0)
    return D


COMPONENTS = [
    HDBSCAN(min_cluster_size=3),
    HDBSCAN(min_cluster_size=0.2),
    HDBSCAN(min_cluster_size=3, backend="sklearn"),
    DBSCAN(eps=0.3, min_samples=2),
    Agglomerative(n_clusters=3, linkage="average"),
    Agglomerative(n_clusters=3, linkage="complete"),
    Agglomerative(n_clusters=3, linkage="single"),
    Agglomerative(distance_threshold=0.5, linkage="complete"),
    KMeans(n_clusters=3),
    KMeans(n_clusters=3, embedding="mds"),
    MeanShift(),
    MeanShift(embedding="mds"),
    AffinityPropagation(),
]


@pytest.mark.parametrize("clusterer", COMPONENTS, ids=lambda c: f"{type(c).__name__}-{COMPONENTS.index(c)}")
def test_recovers_blocks(clusterer):
    D = block_distance()
    labels = clusterer.fit_predict(D, kind="distance")
    assert labels.dtype.kind == "i" and labels.shape == (15,)
    assert adjusted_rand_score(TRUE, labels) == 1.0
    assert list(labels[[0, 5, 10]]) == [0, 1, 2]  # numbered in order of first appearance
    assert clusterer.n_clusters_ == 3


@pytest.mark.parametrize("clusterer", COMPONENTS, ids=lambda c: f"{type(c).__name__}-{COMPONENTS.index(c)}")
def test_recovers_blocks_from_a_similarity(clusterer):
    S = 1.0 - block_distance(1)  # similarities in [0, 1], diagonal 1
    assert adjusted_rand_score(TRUE, clusterer.fit_predict(torch.as_tensor(S), kind="similarity")) == 1.0


def test_kind_conversion_formulas():
    S = np.array([[1.0, -1.0, 0.5], [-1.0, 1.0, 0.0], [0.5, 0.0, 1.0]])  # cosine similarities in [-1, 1]
    np.testing.assert_allclose(to_distance(S, "similarity"), [[0, 2, 0.5], [2, 0, 1], [0.5, 1, 0]])
    np.testing.assert_allclose(to_similarity(to_distance(S, "similarity"), "distance"), S)
    with pytest.raises(ValueError, match="<= 1"):
        to_distance(S * 3 + np.eye(3), "similarity")


def test_affinity_propagation_takes_a_distance_when_told():
    D = block_distance(2)
    ap = AffinityPropagation()
    assert ap.input_kind == "similarity"
    by_distance = ap.fit_predict(D, kind="distance")
    by_similarity = ap.fit_predict(1.0 - D)
    assert np.array_equal(by_distance, by_similarity)
    assert adjusted_rand_score(TRUE, by_distance) == 1.0
    # The mistake the kind argument exists for: a distance passed where a similarity is expected is refused...
    with pytest.raises(ValueError, match="looks like a distance"):
        ap.fit_predict(D)
    # ...and, if forced, inverts the affinities and does not recover the blocks.
    assert adjusted_rand_score(TRUE, AffinityPropagation(noise="singletons").fit_predict(D, validate=False)) < 1.0


def test_similarity_passed_as_distance_is_refused():
    with pytest.raises(ValueError, match="looks like a similarity"):
        Agglomerative(n_clusters=3).fit_predict(1.0 - block_distance())


# ----------------------------------------------------------------------------- noise policies


def outlier_case() -> np.ndarray:
    """Blocks A = 0..4 and B = 5..9 (within 0.1, across 0.9) and an outlier 10 that DBSCAN(eps=0.3) calls
    noise: its closest point is client 0 (in A, 0.5), but its mean distance is lowest to B (0.6 vs ~0.9)."""
    D = np.full((11, 11), 0.9)
    D[:5, :5] = 0.1
    D[5:10, 5:10] = 0.1
    D[10, :5] = D[:5, 10] = 0.99
    D[10, 0] = D[0, 10] = 0.5
    D[10, 5:10] = D[5:10, 10] = 0.6
    np.fill_diagonal(D, 0.0)
    return D


@pytest.mark.parametrize(
    "policy, expected_outlier",
    [("own_cluster", 2), ("singletons", 2), ("nearest", 0), ("nearest_mean", 1), ("keep", -1)],
)
def test_noise_policies_with_an_outlier(policy, expected_outlier):
    labels = DBSCAN(eps=0.3, min_samples=2, noise=policy).fit_predict(outlier_case())
    assert list(labels[:10]) == [0] * 5 + [1] * 5
    assert labels[10] == expected_outlier


def test_noise_policies_two_outliers_and_all_noise():
    raw = np.array([0, 0, -1, 1, 1, -1])
    D = np.ones((6, 6)) - np.eye(6)
    assert list(resolve_noise(raw, D, "own_cluster")) == [0, 0, 1, 2, 2, 1]
    assert list(resolve_noise(raw, D, "singletons")) == [0, 0, 1, 2, 2, 3]
    everything = np.full(4, -1)
    D4 = np.ones((4, 4)) - np.eye(4)
    for policy in ("own_cluster", "nearest", "nearest_mean"):
        assert list(resolve_noise(everything, D4, policy)) == [0, 0, 0, 0]
    assert list(resolve_noise(everything, D4, "singletons")) == [0, 1, 2, 3]


def test_relabel_first_appearance():
    assert list(relabel(np.array([7, 7, 3, -1, 9, 3]))) == [0, 0, 1, -1, 2, 1]


# ----------------------------------------------------------------------------- details and validation


def test_hdbscan_fractional_min_cluster_size():
    assert HDBSCAN(min_cluster_size=0.2).resolved_min_cluster_size(15) == 3
    assert HDBSCAN(min_cluster_size=0.2).resolved_min_cluster_size(30) == 6
    assert HDBSCAN(min_cluster_size=0.05).resolved_min_cluster_size(10) == 2


def test_single_client_and_torch_input():
    assert list(KMeans(n_clusters=3).fit_predict(np.zeros((1, 1)))) == [0]
    labels = Agglomerative(n_clusters=3).fit_predict(torch.as_tensor(block_distance(), dtype=torch.float32))
    assert adjusted_rand_score(TRUE, labels) == 1.0


def test_classical_mds_recovers_euclidean_distances():
    X = np.random.default_rng(3).normal(size=(8, 3))
    D = np.linalg.norm(X[:, None] - X[None], axis=-1)
    Y = classical_mds(D)
    assert Y.shape == (8, 3)
    np.testing.assert_allclose(np.linalg.norm(Y[:, None] - Y[None], axis=-1), D, atol=1e-8)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Agglomerative(n_clusters=3, linkage="ward"), "ward"),
        (lambda: Agglomerative(n_clusters=3, distance_threshold=0.5), "exactly one"),
        (lambda: Agglomerative(), "exactly one"),
        (lambda: HDBSCAN(min_cluster_size=1.5), r"\(0, 1\)"),
        (lambda: HDBSCAN(min_cluster_size=1), ">= 2"),
        (lambda: DBSCAN(eps=0), "eps"),
        (lambda: KMeans(n_clusters=3, embedding="tsne"), "embedding"),
        (lambda: DBSCAN(noise="drop"), "noise"),
        (lambda: make_clusterer("optics"), "unknown clustering algorithm"),
    ],
)
def test_argument_validation(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


@pytest.mark.parametrize(
    "matrix, message",
    [
        (np.zeros((3, 2)), "square"),
        (np.array([[0.0, 1.0], [0.5, 0.0]]), "symmetric"),
        (np.array([[0.0, np.nan], [np.nan, 0.0]]), "NaN"),
        (np.array([[0.0, -1.0], [-1.0, 0.0]]), "non-negative"),
    ],
)
def test_matrix_validation(matrix, message):
    with pytest.raises(ValueError, match=message):
        DBSCAN().fit_predict(matrix)


def test_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        DBSCAN().fit_predict(block_distance(), kind="dist")


def test_hdbscan_min_cluster_size_larger_than_n():
    with pytest.raises(ValueError, match="exceeds"):
        HDBSCAN(min_cluster_size=20).fit_predict(block_distance())


def test_registry():
    assert set(CLUSTERERS) >= {"hdbscan", "dbscan", "agglomerative", "kmeans", "affinity_propagation", "mean_shift"}
    c = make_clusterer("DBSCAN", eps=0.3, min_samples=2)
    assert isinstance(c, DBSCAN) and c.eps == 0.3
    assert isinstance(make_clusterer("affinity-propagation"), AffinityPropagation)

    @register_clusterer("everyone_alone")
    class Alone(Clusterer):
        def _fit(self, matrix):
            return np.arange(matrix.shape[0])

    try:
        assert list(make_clusterer("everyone_alone").fit_predict(block_distance())) == list(range(15))
    finally:
        CLUSTERERS.pop("everyone_alone")


def planted(sizes: list[int], seed: int, within: float = 0.1, across: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """Blocks of the given sizes: distances about `within` inside a block, `across` between; symmetric, zero
    diagonal."""
    rng = np.random.default_rng(seed)
    truth = np.repeat(np.arange(len(sizes)), sizes)
    D = np.where(truth[:, None] == truth[None, :], within, across) + rng.uniform(0, 0.1, (len(truth),) * 2)
    D = 0.5 * (D + D.T)
    np.fill_diagonal(D, 0.0)
    return D, truth


@pytest.mark.parametrize("backend", ["hdbscan", "sklearn"])
def test_hdbscan_finds_four_clusters_of_four_clients_at_ocfls_default(backend):
    """OCFL's default (min_cluster_size 20 %: 4 of 16 clients) on 4 planted clusters of 4: min_samples counts the
    client itself, as sklearn's HDBSCAN (the authors' code) counts it. The hdbscan package given min_samples 4 took
    4 neighbours besides the client, found no core point and returned every client as noise."""
    D, truth = planted([4, 4, 4, 4], seed=0)
    labels = HDBSCAN(min_cluster_size=0.2, backend=backend).fit_predict(D, kind="distance")
    assert adjusted_rand_score(truth, labels) == 1.0


@pytest.mark.parametrize("seed", range(6))
def test_the_two_hdbscan_backends_cluster_alike(seed):
    rng = np.random.default_rng(seed)
    sizes = list(rng.integers(3, 8, size=int(rng.integers(2, 5))))
    D, _ = planted(sizes, seed, within=0.2, across=0.6)
    for min_cluster_size, min_samples in ((0.2, None), (3, None), (3, 2)):
        a, b = (
            HDBSCAN(min_cluster_size=min_cluster_size, min_samples=min_samples, backend=backend).fit_predict(
                D, kind="distance"
            )
            for backend in ("hdbscan", "sklearn")
        )
        assert adjusted_rand_score(a, b) == 1.0, (sizes, min_cluster_size, min_samples)
