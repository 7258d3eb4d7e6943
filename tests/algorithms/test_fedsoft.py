"""FedSoft: importance weights, the centers' importance and the proximal gradient worked by hand; a round's draws and
centers against their definitions; clusters found on rotations; exact resume; bad options refused in one line."""

import numpy as np
import pytest
import torch

from fedlight.algorithms.fedsoft import FedSoft, center_importance, importance_fractions, proximal_gradient

from helpers.federations import small_federation
from helpers.resume import resumed_and_whole


def test_importance_is_the_share_of_samples_each_center_fits_best_with_zero_shares_smoothed():
    """Client 0: rows 0-3, lowest loss under center 0, 0, 1, 0 -> (3/4, 1/4); client 1: rows 4-5, center 1 both times
    -> (sigma, 1)."""
    losses = torch.tensor([[0.1, 0.2, 0.9, 0.3, 2.0, 1.0], [0.5, 0.4, 0.1, 0.8, 1.0, 0.2]])
    owner, sizes = torch.tensor([0, 0, 0, 0, 1, 1]), torch.tensor([4, 2])
    u = importance_fractions(losses, owner, sizes, 1e-4)
    assert torch.allclose(u, torch.tensor([[0.75, 0.25], [1e-4, 1.0]], dtype=torch.float64))
    v = center_importance(u, sizes)  # masses (3, 1) and (2e-4, 2): v_0 = (3, 2e-4) / 3.0002, v_1 = (1, 2) / 3
    assert torch.allclose(v, torch.tensor([[3 / 3.0002, 2e-4 / 3.0002], [1 / 3, 2 / 3]], dtype=torch.float64))


def test_the_proximal_gradient_pulls_towards_the_centers_by_importance():
    """w = (1, 2), centers (0, 0) and (2, 2), u = (1/4, 3/4), lambda 2: 2 ((1, 2) - 3/4 (2, 2)) = (-1, 1)."""
    grad = proximal_gradient(
        torch.tensor([[1.0, 2.0]]), torch.tensor([[0.25, 0.75]]), torch.tensor([[0.0, 0.0], [2.0, 2.0]]), 2.0
    )
    assert torch.allclose(grad, torch.tensor([[-1.0, 1.0]]))


def test_a_round_draws_k_clients_per_center_and_each_center_is_the_mean_of_its_draws_local_models():
    fed = small_federation(FedSoft(num_clusters=2, selection_size=2, reg_weight=0.1), num_clients=6, rounds=2)
    alg = fed.algorithm
    fed.run_round(1)
    draws = alg.draws(1)
    assert [len(d) for d in draws] == [2, 2] and all(len(set(d)) == 2 for d in draws)
    trained = sorted(set().union(*draws))
    local = alg.local_models.read(trained)
    for s, drawn in enumerate(draws):
        expected = local[[trained.index(c) for c in drawn]].mean(dim=0)
        assert torch.allclose(alg.models[s], expected, atol=1e-6)
    untouched = [c for c in range(6) if c not in trained]
    assert all(torch.equal(alg.local_models[c], fed.server.model.initial_params) for c in untouched)


def test_the_draws_follow_the_centers_importance():
    """Over many rounds a center draws each client about K v_sk times out of K draws a round (without replacement,
    the share is pulled towards uniform, so only the order is checked: a client twice as important is drawn more)."""
    alg = small_federation(FedSoft(num_clusters=1, selection_size=1), num_clients=6, rounds=1).algorithm
    sizes = alg.server.clients.train_sizes
    drawn = np.bincount([alg.select_clients(r)[0] for r in range(1, 2001)], minlength=6) / 2000
    expected = (sizes / sizes.sum()).cpu().numpy()
    assert np.abs(drawn - expected).max() < 0.04


def test_on_rotations_the_importance_finds_the_rotation_of_every_client():
    fed = small_federation(
        FedSoft(num_clusters=2, selection_size=None, reg_weight=0.01, estimation_interval=1),
        num_clients=6,
        rounds=6,
        vectorize=6,
    )
    for r in range(1, 7):
        fed.run_round(r)
    truth = fed.data.cluster_labels
    found = fed.algorithm.cluster_labels()
    assert len(set(found)) == 2 and all((found == found[0]) == (truth == truth[0]))


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch):
    """Estimation in rounds 1 and 4 only: round 3 after the resume uses the weights restored from round 1's."""
    args = tiny_run_args + [
        "--algorithm",
        "fedsoft",
        "--algorithm.init_args.num_clusters",
        "2",
        "--algorithm.init_args.selection_size",
        "2",
        "--algorithm.init_args.estimation_interval",
        "3",
        "--federation.rounds",
        "4",
    ]
    crashed, whole = resumed_and_whole(args, tmp_path, monkeypatch)
    assert crashed == whole


@pytest.mark.parametrize(
    "options, message",
    [
        ({"count_smoother": 0.0}, "count_smoother must be in \\(0, 1\\)"),
        ({"reg_weight": -1.0}, "reg_weight must be >= 0"),
        ({"selection_size": 0}, "selection_size must be >= 1 or null"),
        ({"num_clusters": 7}, "num_clusters is 7, more than the 6 clients"),
        ({"selection_size": 9}, "selection_size is 9, more than the 6 clients"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        small_federation(FedSoft(**options), num_clients=6)


def test_a_cohort_count_is_refused():
    with pytest.raises(ValueError, match="FedSoft draws its own clients .* leave federation.clients_per_round out"):
        small_federation(FedSoft(), num_clients=6, clients_per_round=3)
