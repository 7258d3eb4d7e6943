"""Clustering scores on known cases, and the Hopkins statistic against a numpy/scipy computation and data."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cdist

from fedlight.cluster.hopkins import default_sample_size, hopkins, hopkins_from_samples
from fedlight.cluster.scores import clustering_scores

KEYS = {"ari", "ami", "homogeneity", "completeness", "nmi"}


def test_scores_identical_and_relabelled():
    true = [0, 0, 1, 1, 2, 2]
    for pred in ([0, 0, 1, 1, 2, 2], [5, 5, 3, 3, 9, 9]):
        scores = clustering_scores(true, pred)
        assert set(scores) == KEYS
        assert all(v == pytest.approx(1.0) for v in scores.values())


def test_scores_known_values():
    # Everything in one cluster: perfectly complete, not homogeneous, no agreement beyond chance.
    s = clustering_scores(np.array([0, 0, 1, 1]), torch.tensor([0, 0, 0, 0]))
    assert s["completeness"] == pytest.approx(1.0)
    assert s["homogeneity"] == pytest.approx(0.0)
    assert s["ari"] == pytest.approx(0.0) and s["nmi"] == pytest.approx(0.0)
    # Over-splitting: homogeneous but not complete.
    s = clustering_scores([0, 0, 1, 1], [0, 1, 2, 3])
    assert s["homogeneity"] == pytest.approx(1.0) and s["completeness"] < 1.0


def test_scores_validation():
    with pytest.raises(ValueError, match="length"):
        clustering_scores([0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="1-D"):
        clustering_scores([[0, 1]], [[0, 1]])


# ----------------------------------------------------------------------------- Hopkins


def test_hopkins_formula_against_numpy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 4))
    idx = np.array([3, 7, 0])
    U = rng.uniform(X.min(0), X.max(0), size=(3, 4))
    D = cdist(X, X)
    np.fill_diagonal(D, np.inf)
    v = D[idx].min(1)  # real sample -> nearest *other* real point
    z = cdist(U, X).min(1)  # uniform point -> nearest real point
    expected = z.sum() / (z.sum() + v.sum())
    got = hopkins_from_samples(torch.as_tensor(X), torch.as_tensor(idx), torch.as_tensor(U))
    assert got == pytest.approx(expected, rel=1e-12)


def test_hopkins_uniform_is_near_half():
    g = torch.Generator().manual_seed(0)
    for d in (2, 10):
        X = torch.rand(400, d, generator=g)
        values = [hopkins(X, generator=seed) for seed in range(5)]
        assert abs(np.mean(values) - 0.5) < 0.05, values


def test_hopkins_separated_blobs_are_clustered():
    g = torch.Generator().manual_seed(1)
    for d, per_blob in ((2, 50), (500, 5)):  # includes the FedTSDP-like case: 20 points in high dimension
        centers = 10.0 * torch.randn(4, d, generator=g)
        X = torch.cat([c + 0.5 * torch.randn(per_blob, d, generator=g) for c in centers])
        assert min(hopkins(X, generator=seed) for seed in range(5)) > 0.75


def test_hopkins_determinism_and_arguments():
    X = np.random.default_rng(2).normal(size=(30, 3))
    assert hopkins(X, generator=7) == hopkins(X, generator=torch.Generator().manual_seed(7))
    assert hopkins(X, sample_size=30, generator=1) == hopkins(X, sample_size=30, generator=1)
    assert default_sample_size(20) == 5 and default_sample_size(3) == 2 and default_sample_size(2) == 2
    assert hopkins(np.ones((5, 3)), generator=0) == 0.5
    with pytest.raises(ValueError, match="sample_size"):
        hopkins(X, sample_size=31)
    with pytest.raises(ValueError, match="at least 2"):
        hopkins(np.zeros((1, 3)))
