"""SR-FCA: the pivot correlation clustering, the threshold from a fraction and the cross-loss distances worked by hand;
the one-shot losses against a direct computation; rotations recovered after the refine steps; exact resume; bad
options refused in one line."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlight.algorithms.srfca import (
    SRFCA,
    client_cluster_distances,
    cluster_pair_distances,
    cross_loss_distance,
    fraction_threshold,
    pivot_clusters,
)
from fedlight.cluster.scores import clustering_scores

from helpers.federations import small_federation
from helpers.resume import resumed_and_whole


def test_pivot_clustering_of_two_cliques_and_a_bridge():
    """Cliques {0, 1, 2} and {3, 4, 5} with the bridge 2-3. Pivot 0 takes its clique, then pivot 3 (or any node
    left) the other; pivot 2 takes its clique and 3 across the bridge, leaving {4, 5}; pivot 3 first: {2, 3, 4, 5},
    then {0, 1}."""
    adjacency = np.zeros((6, 6), dtype=bool)
    for a, b in [(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5), (2, 3)]:
        adjacency[a, b] = adjacency[b, a] = True
    assert pivot_clusters(adjacency, [0, 3, 1, 2, 4, 5]) == [[0, 1, 2], [3, 4, 5]]
    assert pivot_clusters(adjacency, [2, 4, 0, 1, 3, 5]) == [[0, 1, 2, 3], [4, 5]]
    assert pivot_clusters(adjacency, [3, 5, 0, 1, 2, 4]) == [[2, 3, 4, 5], [0, 1]]


def test_the_threshold_is_the_ceil_fraction_pairs_th_sorted_distance():
    """Pairs (0,1) 0.4, (0,2) 0.1, (0,3) 0.9, (1,2) 0.3, (1,3) 0.7, (2,3) 0.2: sorted 0.1 0.2 0.3 0.4 0.7 0.9.
    Fraction 0.5: ceil(3) = 3 -> 0.4; 0.2: ceil(1.2) = 2 -> 0.3; 0.99: ceil(5.94) = 6, past the end -> 0.9."""
    d = torch.tensor([[0, 0.4, 0.1, 0.9], [0.4, 0, 0.3, 0.7], [0.1, 0.3, 0, 0.2], [0.9, 0.7, 0.2, 0]])
    assert fraction_threshold(d, 0.5) == pytest.approx(0.4)
    assert fraction_threshold(d, 0.2) == pytest.approx(0.3)
    assert fraction_threshold(d, 0.99) == pytest.approx(0.9)


def test_the_cross_loss_distances_by_hand():
    """L = [[0.1, 2.0, 1.0], [1.0, 0.2, 3.0], [0.5, 0.4, 0.3]] (model i on client j): D[0, 1] = (2 + 1) / 2 = 1.5,
    D[0, 2] = (1 + 0.5) / 2 = 0.75. Cluster models' losses M = [[0.2, 0.4, 2.0], [1.0, 1.2, 0.1]], cluster 0 = {0, 1},
    cluster 1 = {2}: client 2 to cluster 0 is (2.0 + (0.5 + 0.4) / 2) / 2 = 1.225, to cluster 1 (0.1 + 0.3) / 2 =
    0.2; the clusters' distance is ((M[0, 2]) + (M[1, 0] + M[1, 1]) / 2) / 2 = (2.0 + 1.1) / 2 = 1.55."""
    L = torch.tensor([[0.1, 2.0, 1.0], [1.0, 0.2, 3.0], [0.5, 0.4, 0.3]])
    D = cross_loss_distance(L)
    assert D[0, 1] == pytest.approx(1.5) and D[1, 0] == pytest.approx(1.5) and D[0, 2] == pytest.approx(0.75)
    M = torch.tensor([[0.2, 0.4, 2.0], [1.0, 1.2, 0.1]])
    members = [torch.tensor([0, 1]), torch.tensor([2])]
    to_clusters = client_cluster_distances(M, L, members)
    assert to_clusters[0, 2] == pytest.approx(1.225) and to_clusters[1, 2] == pytest.approx(0.2)
    assert to_clusters[0, 0] == pytest.approx((0.2 + (0.1 + 2.0) / 2) / 2)
    pairs = cluster_pair_distances(M, members)
    assert pairs[0, 1] == pytest.approx(1.55) and pairs[1, 0] == pytest.approx(1.55)


def test_the_one_shot_losses_are_the_local_models_cross_entropy_on_each_clients_data():
    fed = small_federation(SRFCA(refine_rounds=1, init_epochs=2), num_clients=6, rounds=1)
    fed.run_round(1)
    train = fed.server.clients.split("train")
    for i in (0, 4):
        local = fed.server.clients.train(1, i, fed.server.model.initial_params, epochs=2).params
        for j in (1, 5):
            x, y = train.client(j)
            expected = F.cross_entropy(fed.server.model.predict(local, x), y)
            assert fed.algorithm.local_losses[i, j] == pytest.approx(float(expected), rel=1e-4)


def test_on_rotations_the_refine_steps_end_with_the_rotations():
    fed = small_federation(SRFCA(refine_rounds=1, init_epochs=3), num_clients=6, rounds=3, vectorize=6)
    for r in (1, 2, 3):
        fed.run_round(r)
    alg = fed.algorithm
    assert clustering_scores(fed.data.cluster_labels, alg.cluster_labels())["ari"] == 1.0
    assert len(alg.models) == 2 and bool(alg.clustered.all())
    alg.clustered[0], alg.participation = False, 0.5  # a share of the 5 clustered clients: ceil(2.5) = 3, never 0
    chosen = alg.select_clients(4)
    assert len(chosen) == 3 and 0 not in chosen


def test_a_split_cluster_is_merged_back():
    """After round 1, the rotation {0, 1, 2} is cut in two clusters with the same model: at the step's end the
    clients go back to one of them (or the two merge), and two clusters are left, the rotations."""
    fed = small_federation(
        SRFCA(refine_rounds=1, init_epochs=3, size_threshold=1), num_clients=6, rounds=2, vectorize=6
    )
    alg = fed.algorithm
    fed.run_round(1)
    first = int(alg.assignment[0])
    alg.models = torch.stack([alg.models[first], alg.models[first], alg.models[1 - first]])
    alg.assignment = torch.tensor([0, 0, 1, 2, 2, 2])
    fed.run_round(2)
    assert len(alg.models) == 2
    assert clustering_scores(fed.data.cluster_labels, alg.cluster_labels())["ari"] == 1.0


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch):
    args = tiny_run_args + [
        "--algorithm",
        "srfca",
        "--algorithm.init_args.refine_rounds",
        "1",
        "--algorithm.init_args.init_epochs",
        "2",
    ]
    crashed, whole = resumed_and_whole(args, tmp_path, monkeypatch, crash_round=3)
    assert crashed == whole


@pytest.mark.parametrize(
    "options, message",
    [
        ({"size_threshold": 7}, "size_threshold is 7, more than the 6 clients: give at most 6"),
        ({"dist_fraction": 1.0}, "dist_fraction must be in \\(0, 1\\)"),
        ({"dist_fraction": 0.0}, "dist_fraction must be in \\(0, 1\\)"),
        ({"num_refine_steps": 0}, "num_refine_steps must be >= 1"),
        ({"refine_rounds": 0}, "refine_rounds must be >= 1"),
        ({"dist_threshold": -1.0}, "dist_threshold must be >= 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        small_federation(SRFCA(**options), num_clients=6)


def test_a_cohort_is_refused():
    with pytest.raises(ValueError, match="SR-FCA trains every client in its one-shot round"):
        small_federation(SRFCA(), num_clients=6, clients_per_round=3)
