"""The (k, l)-clustering toolkit against hand computations, scikit-learn, brute force and known properties."""

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from sklearn.cluster import KMeans

from fedlight.cluster import kcenters


def blobs(centers, n=30, scale=0.5, seed=0):
    rng = np.random.default_rng(seed)
    centers = np.asarray(centers, dtype=float)
    x = np.concatenate([c + scale * rng.standard_normal((n, centers.shape[1])) for c in centers])
    return torch.tensor(x), np.repeat(np.arange(len(centers)), n)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def as_sorted_rows(a):
    a = np.asarray(a, dtype=float)
    return a[np.lexsort(a.T[::-1])]


def test_distances_are_the_l_norms_worked_by_hand():
    x = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    c = torch.tensor([[3.0, 4.0]])
    assert torch.allclose(kcenters.distances(x, c, 2), torch.tensor([[5.0], [np.sqrt(8.0)]], dtype=torch.float32))
    assert torch.allclose(kcenters.distances(x, c, 1), torch.tensor([[7.0], [4.0]]))
    assert torch.allclose(kcenters.distances(x, c, 3), torch.tensor([[(27 + 64) ** (1 / 3)], [16 ** (1 / 3)]]))
    # cost with power l and with power 1: squared and plain distances to the nearest center
    centers = torch.tensor([[3.0, 4.0], [1.0, 1.0]])
    assert float(kcenters.cost(x, centers, 2)) == pytest.approx(2.0 + 1.0)  # |(0,0)-(1,1)|^2 + |(1,2)-(1,1)|^2
    assert float(kcenters.cost(x, centers, 2, p=1)) == pytest.approx(np.sqrt(2) + 1.0)


def test_kmeans_plusplus_picks_one_seed_per_far_group_and_is_reproducible():
    x, _ = blobs([[0, 0], [100, 0], [0, 100]], n=20, scale=0.1)
    seeds = kcenters.kmeans_plusplus(x, 3, runs=8, generator=gen(1))
    groups = (seeds // 20).sort(dim=1).values
    assert torch.equal(groups, torch.tensor([[0, 1, 2]] * 8))  # D^2 sampling cannot pick two seeds in one blob
    assert torch.equal(seeds, kcenters.kmeans_plusplus(x, 3, runs=8, generator=gen(1)))
    assert not torch.equal(seeds, kcenters.kmeans_plusplus(x, 3, runs=8, generator=gen(2)))


def test_kmeans_on_separated_blobs_finds_the_blob_means():
    x, truth = blobs([[0, 0], [10, 0], [0, 10], [10, 10]])
    fit = kcenters.fit(x, 4, generator=gen())
    means = np.stack([x.numpy()[truth == g].mean(0) for g in range(4)])
    assert np.allclose(as_sorted_rows(fit.centers), as_sorted_rows(means), atol=1e-9)
    expected_cost = sum(((x.numpy()[truth == g] - means[g]) ** 2).sum() for g in range(4))
    assert fit.cost == pytest.approx(expected_cost, rel=1e-9)


def test_lloyd_from_given_centers_matches_scikit_learn():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 3)) + rng.integers(0, 3, (300, 1)) * 2.0
    init = x[[0, 50, 100, 150, 200]]
    ours = kcenters.lloyd(torch.tensor(x), torch.tensor(init), tol=0.0)
    ref = KMeans(5, init=init, n_init=1, tol=0.0, algorithm="lloyd").fit(x)
    assert np.allclose(ours.centers.numpy(), ref.cluster_centers_, atol=1e-9)
    assert ours.cost == pytest.approx(ref.inertia_, rel=1e-9)
    assert np.array_equal(ours.labels.numpy(), ref.labels_)


def test_weighted_kmeans_equals_kmeans_on_the_replicated_points_and_scikit_learn():
    x, _ = blobs([[0, 0], [6, 0], [0, 6]], n=10, scale=1.0, seed=4)
    w = torch.tensor(np.random.default_rng(5).integers(1, 4, len(x)), dtype=torch.float64)
    weighted = kcenters.fit(x, 3, weights=w, generator=gen())
    replicated = kcenters.fit(x.repeat_interleave(w.long(), dim=0), 3, generator=gen())
    assert np.allclose(as_sorted_rows(weighted.centers), as_sorted_rows(replicated.centers), atol=1e-9)
    ref = KMeans(3, n_init=10, random_state=0).fit(x.numpy(), sample_weight=w.numpy())
    assert np.allclose(as_sorted_rows(weighted.centers), as_sorted_rows(ref.cluster_centers_), atol=1e-9)
    assert weighted.cost == pytest.approx(ref.inertia_, rel=1e-9)


def test_kmedoids_centers_are_data_points_and_optimal_on_a_small_set():
    x, _ = blobs([[0, 0], [8, 0], [0, 8]], n=5, scale=1.5, seed=6)
    fit = kcenters.fit(x, 3, ell=1, medoids=True, generator=gen())
    rows = {tuple(r) for r in x.numpy()}
    assert all(tuple(c) in rows for c in fit.centers.numpy())
    assert torch.equal(x[fit.medoids], fit.centers)
    l1 = np.abs(x.numpy()[:, None] - x.numpy()[None]).sum(-1)
    best = min(l1[:, list(m)].min(1).sum() for m in itertools.combinations(range(len(x)), 3))
    assert fit.cost == pytest.approx(best, rel=1e-9)


def test_kmedoids_matrix_and_cluster_by_cluster_solvers_agree(monkeypatch):
    x, _ = blobs([[0, 0], [5, 0], [0, 5], [5, 5]], n=25, scale=1.5, seed=7)
    full = kcenters.fit(x, 4, ell=1, medoids=True, n_init=3, generator=gen(2))
    monkeypatch.setattr(kcenters, "MEDOID_MATRIX_MAX", 10)
    loop = kcenters.fit(x, 4, ell=1, medoids=True, n_init=3, generator=gen(2))
    assert torch.equal(full.medoids, loop.medoids) and full.cost == pytest.approx(loop.cost)


def test_general_l_centers_minimize_the_coordinate_costs():
    rng = np.random.default_rng(8)
    pts = rng.standard_normal((40, 2)) * [1.0, 3.0]
    w = rng.uniform(0.5, 2.0, 40)
    member = torch.tensor(w).view(1, 40, 1)
    for ell in (1.0, 1.5, 3.0):
        got = kcenters.ell_centers(torch.tensor(pts), member, ell, torch.zeros(1, 1, 2))[0, 0].numpy()
        for j in range(2):
            best = minimize_scalar(
                lambda c: (w * np.abs(pts[:, j] - c) ** ell).sum(),
                bounds=(pts[:, j].min(), pts[:, j].max()),
                method="bounded",
                options={"xatol": 1e-10},
            ).x
            value = lambda c: (w * np.abs(pts[:, j] - c) ** ell).sum()  # noqa: E731
            assert value(got[j]) <= value(best) + 1e-7
    # l = 2 is the weighted mean
    mean = kcenters.ell_centers(torch.tensor(pts), member, 2.0, torch.zeros(1, 1, 2))[0, 0].numpy()
    assert np.allclose(mean, (w[:, None] * pts).sum(0) / w.sum())


def test_lloyd_with_general_l_separates_blobs():
    x, truth = blobs([[0, 0], [10, 0], [0, 10]], n=20, scale=0.5, seed=9)
    fit = kcenters.fit(x, 3, ell=3.0, generator=gen())
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, fit.labels.numpy()) == 1.0


def test_fewer_points_than_k_gives_the_points_and_padding_changes_nothing():
    x = torch.tensor([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    fit = kcenters.fit(x, 5)
    assert torch.equal(fit.centers, x) and fit.cost == 0.0
    padded = kcenters.pad_centers(fit.centers, 5)
    assert padded.shape == (5, 2)
    probe = torch.tensor([[0.2, 0.1], [4.0, 4.5], [1.0, 0.9]])
    assert torch.equal(kcenters.nearest(probe, padded)[1], kcenters.nearest(probe, x)[1])


def test_farthest_first_adds_the_farthest_points_in_turn():
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0], [4.0, 0.0], [-3.0, 0.0]])
    grown = kcenters.farthest_first(points, points[:1], 4)
    # from {0}: 10 is farthest; then distances to {0, 10}: 1 -> 1, 4 -> 4, -3 -> 3, so 4; then -3 (3 > 1)
    assert torch.equal(grown[:, 0], torch.tensor([0.0, 10.0, 4.0, -3.0]))


def test_awasthi_sheffet_recovers_separated_blobs_and_keeps_small_clients_whole():
    x, truth = blobs([[0, 0, 0], [20, 0, 0], [0, 20, 0], [0, 0, 20]], n=25, scale=1.0, seed=10)
    fit = kcenters.awasthi_sheffet(x, 4, gen(3))
    means = np.stack([x.numpy()[truth == g].mean(0) for g in range(4)])
    assert np.allclose(as_sorted_rows(fit.centers), as_sorted_rows(means), atol=1e-9)
    small = x[:3]
    assert torch.equal(kcenters.awasthi_sheffet(small, 4, gen()).centers, small)


def test_fit_is_a_function_of_the_generator_state():
    x, _ = blobs([[0, 0], [3, 0], [0, 3]], n=30, scale=1.5, seed=11)
    a = kcenters.fit(x, 5, n_init=2, generator=gen(7))
    b = kcenters.fit(x, 5, n_init=2, generator=gen(7))
    assert torch.equal(a.centers, b.centers) and torch.equal(a.labels, b.labels)


def test_bad_arguments_are_refused():
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="ell"):
        kcenters.fit(x, 2, ell=0.5)
    with pytest.raises(ValueError, match="weights"):
        kcenters.fit(x, 2, weights=torch.tensor([1.0, -1.0, 1.0, 1.0]))
