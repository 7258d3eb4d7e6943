"""ICFL: the threshold schedule by hand, the split rule on hand-built updates, the incremental join, the rotations
recovered with the cluster and pool models checked against the clients' own training, DP through the engine's
aggregator, exact resume, bad options refused in one line."""

import math

import pytest
import torch

from fedlight.algorithms.icfl import ICFL, bipartition, cohesion, epsilon_2, split_threshold
from fedlight.cluster.similarity import cosine_similarity_matrix
from fedlight.plugin import Updates
from fedlight.run.cli import main

from helpers.federations import small_federation
from helpers.resume import crash_and_resume, rows


class Held:
    """A round's updates as `pre_aggregation` reads them (`updates.all()`)."""

    def __init__(self, updates: Updates) -> None:
        self.updates = updates

    def all(self) -> Updates:
        return self.updates


def fake_round(fed, clients: list[int], changes: torch.Tensor) -> Held:
    """The clients' updates: each starts from its cluster's model and moves by its row of `changes` on the
    parameter entries."""
    alg = fed.algorithm
    ids = torch.as_tensor(clients)
    starts = alg.models[alg.assignment[ids]].clone()
    params = starts.clone()
    params[:, alg.entries] += changes
    n = len(clients)
    return Held(Updates(ids, params, starts, torch.full((n,), 10), torch.zeros(n)))


def directions(fed, count: int, seed: int = 0) -> torch.Tensor:
    """`count` random directions on the parameter entries (nearly orthogonal in this many dimensions)."""
    d = int(fed.algorithm.entries.sum())
    return torch.randn(count, d, generator=torch.Generator().manual_seed(seed))


def test_epsilon_2_and_the_threshold_by_hand():
    """Defaults: epsilon_2 = ln 0.15 / (1 - ln 4) = -1.897120 / -0.386294 = 4.91107; alpha_t = 0 after no
    round, and after 5: 1 - exp(-0.386294 x 5 / 4.91107) = 1 - exp(-0.393290) = 0.325167. With epsilon_1 = e^2 and
    alpha_0 = 1 - 1/e, epsilon_2 = ln(1/e) / (1 - 2) = 1 and alpha_t = 1 - e^-t: 0.632121 at 1, 0.950213 at 3."""
    assert epsilon_2(4.0, 0.85) == pytest.approx(4.91107, abs=1e-5)
    assert split_threshold(0, 4.0, 0.85) == 0.0
    assert split_threshold(5, 4.0, 0.85) == pytest.approx(0.325167, abs=1e-6)
    square, corner = math.e**2, 1 - 1 / math.e
    assert epsilon_2(square, corner) == pytest.approx(1.0)
    assert split_threshold(1, square, corner) == pytest.approx(0.632121, abs=1e-6)
    assert split_threshold(3, square, corner) == pytest.approx(0.950213, abs=1e-6)


def test_the_threshold_reaches_alpha_0_after_epsilon_2_squared_rounds():
    """(e / epsilon_1) ^ (epsilon_2^2 / epsilon_2) = exp(epsilon_2 (1 - ln epsilon_1)) = 1 - alpha_0."""
    for epsilon_1, alpha_0 in [(4.0, 0.85), (6.0, 0.5), (3.0, 0.2)]:
        assert split_threshold(epsilon_2(epsilon_1, alpha_0) ** 2, epsilon_1, alpha_0) == pytest.approx(alpha_0)


def test_epsilon_1_below_e_gives_the_schedule_of_its_twin_above_e():
    """The exponent is t (1 - ln epsilon_1)^2 / ln(1 - alpha_0), and 1 - ln(e^2 / 2) = -(1 - ln 2): 2 and e^2 / 2 give
    one schedule (why the class asks for more than e), with epsilon_2 of opposite signs."""
    twin = math.e**2 / 2
    assert epsilon_2(2.0, 0.85) == pytest.approx(-epsilon_2(twin, 0.85))
    for t in (1, 4, 9):
        assert split_threshold(t, 2.0, 0.85) == pytest.approx(split_threshold(t, twin, 0.85))


def test_cohesion_of_blocks_is_the_largest_block_over_the_members():
    """All ones: lambda_1 = m, alpha_G 1; two blocks of ones (3 and 2 members, 0 across): lambda_1 3, alpha_G 3/5;
    one member: 1 by definition."""
    assert cohesion(torch.ones(4, 4)) == pytest.approx(1.0)
    blocks = torch.block_diag(torch.ones(3, 3), torch.ones(2, 2))
    assert cohesion(blocks) == pytest.approx(0.6)
    assert cohesion(torch.ones(1, 1)) == 1.0
    labels = bipartition(blocks, seed=0)
    assert len(set(labels[:3])) == 1 and len(set(labels[3:])) == 1 and labels[0] != labels[3]


def test_two_blocks_of_near_identical_updates_split_exactly_into_the_blocks():
    """Clients 0-2 move along u, 3-4 along v (u, v nearly orthogonal, each with 0.1 % noise): alpha_G about 3/5,
    below round 31's threshold (0.906), so S0 splits into {0, 1, 2} and {3, 4}, two new clusters."""
    fed = small_federation(ICFL(), num_clients=5, rounds=1)
    alg = fed.algorithm
    u, v = directions(fed, 2)
    noise = 1e-3 * directions(fed, 5, seed=1)
    changes = torch.stack([u, u, u, v, v]) + noise
    assert cohesion(cosine_similarity_matrix(changes)) == pytest.approx(0.6, abs=0.02)
    assert split_threshold(30, 4.0, 0.85) > 0.9
    alg.pre_aggregation(31, fake_round(fed, [0, 1, 2, 3, 4], changes))
    a = alg.assignment.tolist()
    assert a[0] == a[1] == a[2] != a[3] == a[4] and 0 not in a and len(alg.models) == 3


@pytest.mark.parametrize("floor, splits", [(2, True), (3, False)])
def test_a_cluster_size_floor_keeps_a_split_whose_smaller_half_falls_below_it(floor, splits):
    """The blocks of 3 and 2 clients above: with min_cluster_size 2 both halves qualify and S0 splits; with 3 the
    half of 2 does not, and everyone stays in S0 though alpha_G is below the threshold."""
    fed = small_federation(ICFL(min_cluster_size=floor), num_clients=5, rounds=1)
    alg = fed.algorithm
    u, v = directions(fed, 2)
    changes = torch.stack([u, u, u, v, v]) + 1e-3 * directions(fed, 5, seed=1)
    alg.pre_aggregation(31, fake_round(fed, [0, 1, 2, 3, 4], changes))
    assert (len(alg.models) == 3) is splits
    assert (alg.assignment.tolist() == [0] * 5) is not splits


def test_one_block_does_not_split():
    """Four clients along u (0.1 % noise): alpha_G about 1, above round 31's threshold: everyone stays in S0."""
    fed = small_federation(ICFL(), num_clients=4, rounds=1)
    alg = fed.algorithm
    u = directions(fed, 1)
    alg.pre_aggregation(31, fake_round(fed, [0, 1, 2, 3], u + 1e-3 * directions(fed, 4, seed=1)))
    assert alg.assignment.tolist() == [0, 0, 0, 0] and len(alg.models) == 1


def test_a_pool_client_joins_the_cluster_its_update_points_to():
    """Clusters 1 and 2 lie along u and v from S0's model; a pool client moving along v (plus noise) joins 2, one
    moving along u joins 1; no one else moves."""
    fed = small_federation(ICFL(), num_clients=5, rounds=1)
    alg = fed.algorithm
    u, v, noise = directions(fed, 3)
    centre = alg.models[0].clone()
    alg.models = torch.stack([centre, centre, centre])
    alg.models[1, alg.entries] += u
    alg.models[2, alg.entries] += v
    alg.assignment = torch.tensor([1, 1, 2, 2, 0])
    alg.pre_aggregation(5, fake_round(fed, [4], (0.5 * v + 0.2 * noise)[None]))
    assert alg.assignment.tolist() == [1, 1, 2, 2, 2]
    alg.assignment[4] = 0
    alg.pre_aggregation(5, fake_round(fed, [4], (0.5 * u + 0.2 * noise)[None]))
    assert alg.assignment.tolist() == [1, 1, 2, 2, 1]


def test_on_rotations_it_recovers_the_two_clusters_and_averages_them():
    """epsilon_1 20 (threshold 0.877 in round 2): round 1 never splits (alpha_t 0); round 2 splits S0 into the two
    rotations (ARI 1). Each cluster model is the size-weighted mean of its members' own training of S0's model (the
    module's SGD, no momentum), and S0's model the clusters' mean weighted by their members' training-set sizes."""
    fed = small_federation(ICFL(epsilon_1=20.0), num_clients=6, rounds=2)
    alg = fed.algorithm
    assert fed.run_round(1).scalars["cluster/ari"] == 0.0 and len(alg.models) == 1
    start = alg.models[0].clone()
    assert fed.run_round(2).scalars["cluster/ari"] == 1.0
    sizes = fed.server.clients.train_sizes.double()
    own = torch.stack([fed.server.clients.train(2, c, start).params for c in range(6)]).double()
    totals = []
    for row in (1, 2):
        members = (alg.assignment == row).nonzero().flatten()
        expected = sizes[members] @ own[members] / sizes[members].sum()
        assert torch.allclose(alg.models[row].double(), expected, atol=1e-5)
        totals.append(sizes[members].sum())
    pooled = (totals[0] * alg.models[1].double() + totals[1] * alg.models[2].double()) / sum(totals)
    assert torch.allclose(alg.models[0].double(), pooled, atol=1e-6)


def test_with_half_the_clients_the_unsampled_stay_in_the_pool_and_join_when_sampled():
    """Half the clients a round, epsilon_1 20 (threshold 0.877 in round 2): S0 splits in round 2 on its 3 sampled
    clients, who form the two clusters, while the 3 not sampled stay in S0 (label 0); in round 3 the sampled ones
    still in S0 join a cluster."""
    fed = small_federation(ICFL(epsilon_1=20.0, participation=0.5), num_clients=6, rounds=3)
    alg = fed.algorithm
    fed.run_round(1)
    sampled = alg.select_clients(2)
    fed.run_round(2)
    assert len(alg.models) == 3 and len(sampled) == 3
    assert all(alg.assignment[c] > 0 for c in sampled)
    assert all(alg.assignment[c] == 0 for c in set(range(6)) - set(sampled))
    fed.run_round(3)
    assert all(alg.assignment[c] > 0 for c in alg.select_clients(3))


def test_differential_privacy_applies_to_the_cluster_means():
    from fedlight.aggregators.privacy import PrivacyConfig

    fed = small_federation(ICFL(), num_clients=3, rounds=1, privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0))
    assert fed.run_round(1).scalars["privacy/epsilon"] > 0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"epsilon_1": math.e}, r"epsilon_1 must be above e \(2.718...\), got 2.718"),
        ({"epsilon_1": 2.0}, "epsilon_1 must be above e"),
        ({"alpha_0": 0.0}, r"alpha_0 must be in \(0, 1\), got 0.0"),
        ({"alpha_0": 1.0}, r"alpha_0 must be in \(0, 1\)"),
        ({"alpha_0": -0.5}, r"alpha_0 must be in \(0, 1\)"),
        ({"min_cluster_size": 0}, "min_cluster_size must be at least 1, or null for no floor, got 0"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    with pytest.raises(ValueError, match=message) as error:
        ICFL(**options)
    assert "\n" not in str(error.value)


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch):
    """epsilon_1 20: S0 splits in round 2, so the resumed round 3 starts from the saved clusters."""
    args = tiny_run_args + ["--algorithm", "icfl", "--algorithm.init_args.epsilon_1", "20"]
    assert main(args + ["--run_name", "whole"]) == 0
    crash_and_resume(args, tmp_path / "crashed", monkeypatch, crash_round=3)
    whole = rows(tmp_path / "whole" / "metrics.csv")
    assert rows(tmp_path / "crashed" / "metrics.csv") == whole and float(whole[-1]["cluster/count"]) >= 2
