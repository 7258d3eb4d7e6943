"""CFL-GP: the accumulation, the spectral partition, the choice of K and the label matching worked by hand; the
queries at the criterion model and the Gram matrix against direct computations; rotations recovered; exact resume;
bad options refused in one line."""

import numpy as np
import pytest
import torch

from fedlight.algorithms.cflgp import (
    CFLGP,
    accumulate,
    estimate_cluster_count,
    match_labels,
    reduced_profiles,
    spectral_partition,
)

from helpers.federations import small_federation
from helpers.resume import resumed_and_whole


def same_partition(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return bool(((a[:, None] == a[None, :]) == (b[:, None] == b[None, :])).all())


def test_the_profile_is_the_running_mean_of_its_queries_or_decays_by_a_constant_step():
    """Queries (1, 2), (3, -2), (-1, 1): running mean (1, 2), (2, 0), (1, 1/3); beta 0.5 after the first visit:
    (1, 2), 0.5 (1, 2) + 0.5 (3, -2) = (2, 0), 0.5 (2, 0) + 0.5 (-1, 1) = (0.5, 0.5)."""
    queries = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, -2.0]]), torch.tensor([[-1.0, 1.0]])]
    mean, decayed = torch.zeros(1, 2), torch.zeros(1, 2)
    for visit, query in enumerate(queries, start=1):
        mean = accumulate(mean, torch.tensor([visit]), query, None)
        decayed = accumulate(decayed, torch.tensor([visit]), query, 0.5)
    assert torch.allclose(mean, torch.tensor([[1.0, 1 / 3]]))
    assert torch.allclose(decayed, torch.tensor([[0.5, 0.5]]))


def test_the_spectral_partition_of_a_block_gram_matrix_is_its_blocks():
    """Profiles 2 e1, 2 e1, e2, e2, e2, 3 e3: the Gram matrix has blocks 4, 1 and 9; each block c ones(m, m) has the
    eigenvalue c m with eigenvector ones / sqrt(m), so a client's reduced profile is sqrt(c) along its block's axis:
    norms 2, 2, 1, 1, 1, 3, and the clients of a block coincide."""
    gram = torch.block_diag(torch.full((2, 2), 4.0), torch.ones(3, 3), torch.full((1, 1), 9.0))
    points = reduced_profiles(gram, 3)
    assert torch.allclose(points.norm(dim=1), torch.tensor([2.0, 2, 1, 1, 1, 3], dtype=torch.float64))
    assert same_partition(spectral_partition(gram, 3, seed=0), [0, 0, 1, 1, 1, 2])


def test_the_reduced_profiles_are_the_projections_on_the_top_left_singular_vectors():
    """The authors' P_K^T G from numpy's SVD of the (entries, clients) profile matrix G, against the same points from
    G^T G: equal up to the sign of each coordinate."""
    G = np.random.default_rng(0).normal(size=(12, 7))
    P, _, _ = np.linalg.svd(G, full_matrices=False)
    expected = (P[:, :3].T @ G).T
    found = reduced_profiles(torch.as_tensor(G.T @ G), 3).numpy()
    assert np.allclose(np.abs(found), np.abs(expected), atol=1e-9)


def test_k_is_chosen_by_the_eigengap_and_the_silhouette():
    """Nine profiles near three orthogonal directions: three singular values stand out, and three clusters have
    the best silhouette of k = 2..5."""
    rng = np.random.default_rng(1)
    directions = np.eye(8)[[0, 3, 6]] * 5
    profiles = np.repeat(directions, 3, axis=0) + 0.1 * rng.normal(size=(9, 8))
    assert estimate_cluster_count(torch.as_tensor(profiles @ profiles.T), 5, seed=0) == 3


def test_new_labels_are_renamed_to_agree_most_with_the_old_ones():
    old = np.array([0, 0, 1, 1, 2, 2])
    assert match_labels(np.array([2, 2, 0, 0, 1, 1]), old, np.ones(6, dtype=bool), 3).tolist() == old.tolist()
    # clients 4 and 5 were not labelled before: their new cluster takes the label left over
    known = np.array([True, True, True, True, False, False])
    assert match_labels(np.array([1, 1, 0, 0, 2, 2]), old, known, 3).tolist() == [0, 0, 1, 1, 2, 2]


def test_a_query_round_sends_each_clients_update_at_the_criterion_model():
    """Round 2 queries model 1: a client of cluster 1 sends its own update, one of cluster 0 its update trained from
    model 1 (first visit of that block: the profile is the query itself)."""
    fed = small_federation(CFLGP(num_clusters=2, clustering_period=1), num_clients=6, rounds=2)
    alg = fed.algorithm
    fed.run_round(1)
    models = alg.models.clone()
    fed.run_round(2)
    labels = alg.cluster_labels()
    for client in (int(np.flatnonzero(labels == 0)[0]), int(np.flatnonzero(labels == 1)[0])):
        trained = fed.server.clients.train(2, client, models[1]).params
        assert torch.allclose(alg.profile[client][1], (trained - models[1])[alg.entries], atol=1e-6)
    assert alg.visits.tolist() == [[1, 1]] * 6  # model 0 queried in round 1, model 1 in round 2


def test_the_gram_matrix_holds_the_inner_products_of_the_seen_clients_profiles():
    fed = small_federation(CFLGP(num_clusters=2, clustering_period=1, participation=0.5), num_clients=6, rounds=3)
    alg = fed.algorithm
    for r in range(1, 4):
        fed.run_round(r)
    seen = alg.seen.nonzero().flatten()
    profiles = alg.profile.read(seen).flatten(1).double()
    assert torch.allclose(alg.gram[seen][:, seen], profiles @ profiles.T, rtol=1e-6)
    assert not alg.gram[~alg.seen].any()


def test_on_rotations_the_first_clustering_finds_the_rotations_and_keeps_them():
    fed = small_federation(CFLGP(num_clusters=2), num_clients=6, rounds=3, vectorize=6)
    for r in range(1, 4):
        fed.run_round(r)
        assert same_partition(fed.algorithm.cluster_labels(), fed.data.cluster_labels)
    assert fed.algorithm.clustered_round == 3  # clustering rounds 1 and 3 (P = 2)


def test_with_k_unknown_the_round_after_the_warm_up_chooses_it():
    fed = small_federation(
        CFLGP(num_clusters=3, unknown_k=True, warmup_rounds=1, clustering_period=1),
        num_clients=6,
        rounds=3,
        vectorize=6,
    )
    alg = fed.algorithm
    fed.run_round(1)
    fed.run_round(2)
    assert alg.clusters == 2 and len(alg.models) == 1 and not alg.assignment.any()
    fed.run_round(3)
    assert same_partition(alg.cluster_labels(), fed.data.cluster_labels)


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch):
    args = tiny_run_args + [
        "--algorithm",
        "cflgp",
        "--algorithm.init_args.num_clusters",
        "2",
        "--algorithm.init_args.clustering_period",
        "1",
        "--algorithm.init_args.participation",
        "0.5",
        "--federation.rounds",
        "3",
    ]
    crashed, whole = resumed_and_whole(args, tmp_path, monkeypatch, crash_round=2)
    assert crashed == whole


@pytest.mark.parametrize(
    "options, message",
    [
        ({"num_clusters": 7}, "num_clusters is 7, more than the 6 clients"),
        ({"beta": 0.0}, "beta must be in \\(0, 1\\] or null"),
        ({"beta": -0.5}, "beta must be in \\(0, 1\\] or null"),
        ({"clustering_period": 0}, "clustering_period must be >= 1"),
        ({"warmup_rounds": 3, "clustering_rounds": 2}, "clustering_rounds is 2: no query round from round 4"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        small_federation(CFLGP(**options), num_clients=6)


def test_a_privacy_section_is_refused():
    from fedlight.aggregators.privacy import PrivacyConfig

    with pytest.raises(
        ValueError,
        match=r"CFLGP's clients send 'criterion_update' \(a value the server reads client "
        r"by client\).*DP does not clip or noise.*leave the privacy section out",
    ):
        small_federation(CFLGP(num_clusters=2), num_clients=6, privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0))
