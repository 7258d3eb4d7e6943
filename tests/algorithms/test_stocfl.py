"""StoCFL: the merge rule on hand-built representations, the proximal term's gradient against autograd, the two
rows each client adds to the aggregation, the rotations recovered under partial participation, newcomers placed
by their representation, exact resume, bad options refused in one line."""

import numpy as np
import pytest
import torch

from fedlight.algorithms.stocfl import StoCFL, merge_components, pooled_mean, proximal_gradient

from helpers.federations import small_federation
from helpers.newcomers import FederationNewcomers
from helpers.resume import resumed_and_whole


def same_partition(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return bool(((a[:, None] == a[None, :]) == (b[:, None] == b[None, :])).all())


def test_pairs_above_tau_unite_transitively():
    """Cosines: 0-1 0.8, 1-2 0.7, 0-2 0.1, 3 alone (0.0 with all): at tau 0.6, 0-1-2 is one chain; at 0.75, only 0-1."""
    similarity = torch.tensor([[1.0, 0.8, 0.1, 0.0], [0.8, 1.0, 0.7, 0.0], [0.1, 0.7, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert same_partition(merge_components(similarity, 0.6), [0, 0, 0, 1])
    assert same_partition(merge_components(similarity, 0.75), [0, 0, 1, 2])
    assert same_partition(merge_components(similarity, 0.8), [0, 0, 1, 2])  # >= tau unites, as the authors' code


def test_the_pooled_representation_is_the_mean_of_every_members_psi():
    """A cluster of 3 members with mean (1, 2) and one of 1 member (5, -2): the 4 members' psi sum to (8, 4)."""
    merged = pooled_mean(torch.tensor([[1.0, 2.0], [5.0, -2.0]]), torch.tensor([3, 1]))
    assert torch.allclose(merged, torch.tensor([2.0, 1.0]))


def test_three_new_clients_two_similar_form_two_clusters_with_the_mean_representation():
    """Three clients seen at once, psi_1 = psi_0 + a small change (cosine about 0.99), psi_2 independent (cosine about
    0 in this many dimensions): clients 0 and 1 share a cluster whose representation is (psi_0 + psi_1) / 2, whose
    model is the global model's copy; client 2 has its own."""
    fed = small_federation(StoCFL(tau=0.65), num_clients=3, rounds=1)
    alg = fed.algorithm
    d = int(alg.entries.sum())
    g = torch.Generator().manual_seed(0)
    psi0, psi2 = torch.randn(d, generator=g), torch.randn(d, generator=g)
    psi1 = psi0 + 0.1 * torch.randn(d, generator=g)
    alg.open_clusters([0, 1, 2], torch.stack([psi0, psi1, psi2]))
    alg.merge([1, 2, 3])
    a = alg.assignment.tolist()
    assert a[0] == a[1] != a[2] and 0 not in a and len(alg.models) == 3  # the global row and two clusters
    assert torch.allclose(alg.representations[a[0]], (psi0 + psi1) / 2)
    assert torch.equal(alg.representations[a[2]], psi2) and alg.members.tolist() == [0, 2, 1]
    assert torch.equal(alg.models[a[0]], alg.models[0])


def test_a_merged_cluster_keeps_the_model_of_its_larger_part():
    fed = small_federation(StoCFL(tau=0.5), num_clients=4, rounds=1)
    alg = fed.algorithm
    d = int(alg.entries.sum())
    psi = torch.zeros(4, d)
    psi[:, 0] = 1.0
    alg.open_clusters([0, 1], psi[:2])
    alg.merge([1, 2])  # one cluster of two members, row 1
    alg.models[1] += 1.0  # it trained
    alg.open_clusters([2], psi[2:3])
    alg.merge([1, 2])
    assert alg.assignment.tolist() == [1, 1, 1, 0] and torch.equal(alg.models[1], alg.models[0] + 1.0)


def test_the_proximal_gradient_is_lambda_times_the_distance_to_the_global_model():
    """By hand: lambda 0.5, theta (1, -2, 3), omega (0, 2, 1): 0.5 (1, -4, 2) = (0.5, -2, 1); and autograd of
    (lambda / 2) ||theta - omega||^2 at random points."""
    by_hand = proximal_gradient(torch.tensor([1.0, -2.0, 3.0]), torch.tensor([0.0, 2.0, 1.0]), 0.5)
    assert torch.equal(by_hand, torch.tensor([0.5, -2.0, 1.0]))
    theta, omega = torch.randn(3, 7, requires_grad=True), torch.randn(7)
    (0.05 / 2 * ((theta - omega) ** 2).sum()).backward()
    assert torch.allclose(proximal_gradient(theta.detach(), omega, 0.05), theta.grad)


def test_each_client_trains_its_cluster_model_with_the_pull_and_the_global_model_alone():
    """Round 2's global model is the size-weighted mean of the clients' own training of round 1's global model, and
    each cluster model that of its members' training of it with the proximal gradient (the module's SGD, no
    momentum: theta <- theta - lr (grad + lambda (theta - omega)))."""
    fed = small_federation(StoCFL(tau=0.65, lam=0.5), num_clients=6, rounds=2)
    alg = fed.algorithm
    fed.run_round(1)
    alg.begin_round(2)
    omega, models, assignment = alg.models[0].clone(), alg.models.clone(), alg.assignment.clone()
    fed.algorithm.begin_round = lambda round: None  # clustered above
    fed.run_round(2)
    sizes = fed.server.clients.train_sizes.double()
    own = torch.stack([fed.server.clients.train(2, c, omega).params for c in range(6)]).double()
    assert torch.allclose(alg.models[0].double(), sizes @ own / sizes.sum(), atol=1e-5)
    pulled = torch.stack(
        [
            fed.server.clients.train(
                2, c, models[assignment[c]], gradient_hook=lambda p, g, s: g.add_(p - omega, alpha=0.5)
            ).params
            for c in range(6)
        ]
    ).double()
    for row in assignment.unique().tolist():
        members = (assignment == row).nonzero().flatten()
        expected = sizes[members] @ pulled[members] / sizes[members].sum()
        assert torch.allclose(alg.models[row].double(), expected, atol=1e-5)


def test_the_runs_robust_rule_combines_the_global_copies():
    """Under `aggregator: median` the global model after round 1 is the coordinate-wise median of the three clients'
    own training of the initial model; under DP the round spends privacy (the aggregation is the engine's)."""
    from fedlight.aggregators.privacy import PrivacyConfig

    fed = small_federation(StoCFL(observe_epochs=1), num_clients=3, rounds=1, aggregator="median")
    initial = fed.server.model.initial_params.clone()
    fed.run_round(1)
    own = torch.stack([fed.server.clients.train(1, c, initial).params for c in range(3)])
    assert torch.allclose(fed.algorithm.models[0], own.median(dim=0).values, atol=1e-6)
    private = small_federation(
        StoCFL(observe_epochs=1), num_clients=3, rounds=1, privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0)
    )
    assert private.run_round(1).scalars["privacy/epsilon"] > 0


def test_on_rotations_with_half_the_clients_a_round_it_recovers_the_two_clusters():
    """Seed 0 draws clients 0 3 4, 0 1 5, 3 4 5, 1 3 5, 1 2 5: no cluster ever mixes the rotations (a client joins a
    cluster only when they are sampled together, so client 5, first seen beside client 0 alone, waits for round 3),
    and once client 2 arrives in round 5 the clustering is the true one (ARI 1)."""
    fed = small_federation(StoCFL(observe_epochs=10, participation=0.5), num_clients=6, rounds=5, vectorize=6)
    truth = fed.data.cluster_labels
    for r in range(1, 6):
        fed.run_round(r)
        labels = fed.algorithm.cluster_labels()
        seen = labels != 0
        assert all(len(set(truth[labels == k])) == 1 for k in set(labels[seen])), r
    assert seen.all() and same_partition(labels, truth) and len(fed.algorithm.models) == 3  # omega and 2 clusters


def test_a_newcomer_joins_the_cluster_of_most_similar_representation_or_gets_the_global_model():
    """Newcomers of another federation (same rotations, other samples) join their rotation's cluster; with tau 1 no
    cluster is similar enough and every newcomer gets the global model, label 0."""
    fed = small_federation(StoCFL(observe_epochs=10), num_clients=8, rounds=1, vectorize=8)
    fed.run_round(1)
    other = small_federation(None, num_clients=8, seed=1)
    models, groups, clusters = fed.algorithm.newcomer_models(FederationNewcomers(other))
    assert same_partition(clusters.numpy(), other.data.cluster_labels) and torch.equal(groups, clusters)
    assert 0 not in clusters.tolist() and models is fed.algorithm.models
    fed.algorithm.tau = 1.0
    assert fed.algorithm.newcomer_models(FederationNewcomers(other))[2].tolist() == [0] * 8


@pytest.mark.parametrize(
    "options, message",
    [
        ({"tau": 1.5}, r"tau must be in \[-1, 1\] \(a cosine similarity\), got 1.5"),
        ({"tau": -1.01}, r"tau must be in \[-1, 1\]"),
        ({"lam": -0.1}, "lam must be >= 0"),
        ({"observe_epochs": 0}, "observe_epochs must be >= 1"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message) as error:
        StoCFL(**options)
    assert "\n" not in str(error.value)


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch):
    args = tiny_run_args + [
        "--algorithm",
        "stocfl",
        "--algorithm.init_args.participation",
        "0.5",
        "--algorithm.init_args.observe_epochs",
        "2",
        "--federation.rounds",
        "3",
    ]
    crashed, whole = resumed_and_whole(args, tmp_path, monkeypatch, crash_round=2)
    assert crashed == whole
