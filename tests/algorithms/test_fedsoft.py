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


def hand_gradient(fed, params: torch.Tensor, client: int) -> torch.Tensor:
    """The flat gradient of the mean cross-entropy on client `client`'s whole training split at `params`, from a copy
    of the network run by hand (one full-batch step: no sample order involved)."""
    import copy

    network = copy.deepcopy(fed.module.network).train()
    named = dict(network.named_parameters())
    tensors = named | dict(network.named_buffers())
    with torch.no_grad():
        for name, value in fed.flat.views(params).items():
            tensors[name.removeprefix("network.")].copy_(value)
    x, y = fed.transform(fed.data.train.client(client), 0)
    loss = torch.nn.functional.cross_entropy(network(x), y)
    grads = dict(zip(named, torch.autograd.grad(loss, list(named.values()))))
    return torch.cat(
        [
            grads[e.name.removeprefix("network.")].flatten() if e.is_parameter else torch.zeros(e.numel)
            for e in fed.flat.entries
        ]
    )


def test_a_local_step_is_sgd_on_the_loss_plus_the_importance_weighted_pull_by_hand():
    """One full-batch SGD step from the initial model:
    w_1 = w_0 - lr (grad f_k(w_0) + lambda sum_s u_ks (w_0 - c_s))."""
    lam, lr = 0.5, 0.1
    fed = small_federation(
        FedSoft(num_clusters=2, selection_size=None, reg_weight=lam), num_clients=4, batch_size=10_000, lr=lr
    )
    centers, start = fed.algorithm.models.clone(), fed.server.model.initial_params.clone()
    fed.run_round(1)
    u = fed.algorithm.fractions.float()  # estimated at round 1's start, before training (tau = 2)
    parameters = fed.flat.parameter_mask()
    for client in range(4):
        pull = lam * sum(u[client, s] * (start - centers[s]) for s in range(2))
        expected = start - lr * (hand_gradient(fed, start, client) + pull)
        trained = fed.algorithm.local_models[client]
        assert torch.allclose(trained[parameters], expected[parameters], atol=1e-6)


def test_without_selection_each_center_is_the_importance_weighted_sum_of_every_local_model_by_hand():
    """c_s = sum_k v_sk w_k with v_sk = u_ks n_k / sum_j u_js n_j, written out over the clients."""
    fed = small_federation(FedSoft(num_clusters=2, selection_size=None, reg_weight=0.1), num_clients=5)
    fed.run_round(1)
    alg = fed.algorithm
    u = alg.fractions.cpu().numpy()
    n = alg.server.clients.train_sizes.cpu().numpy()
    for s in range(2):
        total = sum(u[j, s] * n[j] for j in range(5))
        expected = sum(float(u[k, s] * n[k] / total) * alg.local_models[k] for k in range(5))
        assert torch.allclose(alg.models[s], expected, atol=1e-6)
