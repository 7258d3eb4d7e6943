"""Robust aggregation rules against hand-worked cases, the engine's cluster aggregator on updates (FedEM's
components too), and the bad settings refused in one line, at set-up or, for an algorithm that combined its
updates without the aggregator, after round 1."""

from __future__ import annotations

import math

import re

import pytest
import torch

from fedlight import Algorithm
from fedlight.plugin import Plan
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedem import FedEM
from fedlight.algorithms.local import Local
from fedlight.cluster.differences import Differences
from fedlight.aggregators.cluster_aggregator import RobustClusterAggregate
from fedlight.aggregators.config import AggregatorConfig
from fedlight.aggregators.privacy import PrivacyConfig
from fedlight.aggregators.robust import (
    apply_rule,
    bulyan,
    clip_rows,
    coordinate_median,
    geometric_median,
    krum,
    krum_scores,
    multikrum,
    trimmed_mean,
)

from helpers.federations import small_federation


def column(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)[:, None]


def test_coordinate_median_takes_the_middle_of_each_coordinate():
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [100.0, -5.0]])
    # sorted: 1 2 3 100 -> (2 + 3) / 2; -5 10 20 30 -> (10 + 20) / 2
    assert coordinate_median(x).tolist() == [2.5, 15.0]
    assert coordinate_median(x[:3]).tolist() == [2.0, 20.0]


def test_trimmed_mean_drops_the_extremes_of_each_coordinate():
    x = torch.tensor([[1.0, -50.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [100.0, 3.0]])
    # beta 0.2 of 5 rows: one value cut at each end -> mean(2, 3, 4) and mean(0, 1, 2)
    assert trimmed_mean(x, 0.2).tolist() == [3.0, 1.0]
    assert trimmed_mean(x, 0.0).tolist() == pytest.approx([22.0, -8.8])


def test_krum_picks_the_point_with_the_closest_neighbours():
    x = column(0.0, 1.0, 2.5, 3.0, 50.0)
    # f = 1, m = 5: each row sums its m - f - 2 = 2 smallest squared distances
    # 0: 1 + 6.25; 1: 1 + 2.25; 2.5: 0.25 + 2.25; 3: 0.25 + 4; 50: 47^2 + 47.5^2
    assert krum_scores(x, 1).tolist() == [7.25, 3.25, 2.5, 4.25, 47.0**2 + 47.5**2]
    assert krum(x, 1).item() == 2.5
    # Multi-Krum keeps m - f = 4 lowest scores: every point but 50
    assert multikrum(x, 1).item() == pytest.approx((0 + 1 + 2.5 + 3) / 4)
    assert multikrum(x, 1, keep=2).item() == pytest.approx((2.5 + 1) / 2)


def test_bulyan_selects_by_krum_then_averages_around_the_median():
    x = column(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 100.0)
    # f = 1, m = 7: theta = 5 rows chosen by Krum one at a time (worked by hand: 2, 3, 1, 4, 0), so the attacker 100
    # and 5 are out; beta = theta - 2f = 3 values closest to the median 2 of {0..4}: 1, 2, 3 -> 2
    assert bulyan(x, 1).item() == 2.0
    two_d = torch.cat([x, -3 * x], dim=1)  # each coordinate on its own: the same selection, scaled
    assert bulyan(two_d, 1).tolist() == [2.0, -6.0]


def test_krum_and_bulyan_lower_f_in_a_cluster_too_small_for_it():
    three = column(0.0, 1.0, 10.0)
    # f = 5 with 3 members becomes f = 0: one nearest neighbour each, scores 1, 1, 81 -> the first
    assert apply_rule("krum", three, torch.ones(3), f=5).item() == 0.0
    # Bulyan with f = 0 keeps every row and averages each coordinate's values: the mean
    assert apply_rule("bulyan", three, torch.ones(3), f=5).item() == pytest.approx(11 / 3)


def test_geometric_median_of_known_configurations():
    square = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert geometric_median(square, torch.ones(4)).tolist() == pytest.approx([0.5, 0.5], abs=1e-5)
    # a vertex whose weight is at least the others' together is the weighted geometric median
    triangle = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert geometric_median(triangle, torch.tensor([3.0, 1.0, 1.0])).tolist() == pytest.approx([0, 0], abs=1e-4)
    # equilateral triangle: the Fermat point is the centroid; a far outlier moves it little (unlike the mean)
    h = math.sqrt(3) / 2
    equilateral = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, h]], dtype=torch.float64)
    assert geometric_median(equilateral, torch.ones(3)).tolist() == pytest.approx([0.5, h / 3], abs=1e-5)
    points = torch.tensor([[-1.0], [0.0], [1.0], [1000.0]], dtype=torch.float64).repeat(1, 2)
    assert 0 <= geometric_median(points, torch.ones(4))[0].item() <= 1  # every point of [0, 1] is a median


def test_clipped_rows_have_norm_at_most_the_bound_and_keep_their_direction():
    torch.manual_seed(0)
    x = torch.randn(50, 30) * torch.logspace(-2, 2, 50)[:, None]
    clipped = clip_rows(x, 1.5)
    norms = clipped.norm(dim=1)
    assert bool((norms <= 1.5 * (1 + 1e-6)).all())
    small = x.norm(dim=1) <= 1.5
    assert torch.equal(clipped[small], x[small])
    assert torch.allclose(norms[~small], torch.full_like(norms[~small], 1.5), rtol=1e-5)
    cosine = torch.nn.functional.cosine_similarity(clipped, x)
    assert torch.allclose(cosine, torch.ones(50), atol=1e-5)


def test_the_cluster_aggregator_applies_the_rule_to_updates_within_each_cluster():
    starts = torch.tensor([[10.0, 10.0]] * 3 + [[-4.0, 0.0]] * 3)
    updates = torch.tensor([[1.0, 0.0], [2.0, 0.0], [90.0, 0.0], [0.0, 1.0], [0.0, 3.0], [0.0, -60.0]])
    clusters = torch.tensor([0, 0, 0, 2, 2, 2])
    aggregate = RobustClusterAggregate(AggregatorConfig("median"), 3, 2, torch.float32, torch.device("cpu"))
    aggregate.add(clusters, torch.ones(6), starts + updates, starts)
    active, models = aggregate.means()
    assert active.tolist() == [0, 2]
    assert models.tolist() == [[12.0, 10.0], [-4.0, 1.0]]  # start + the median update of each cluster
    # the clipped mean clips updates (not models): norms 1, 2, 90 clipped to 1.5 -> (1 + 1.5 + 1.5) / 3
    clipped = RobustClusterAggregate(
        AggregatorConfig("clipped_mean", clip=1.5), 3, 2, torch.float32, torch.device("cpu")
    )
    clipped.add(clusters[:3], torch.ones(3), starts[:3] + updates[:3], starts[:3])
    assert clipped.means()[1][0].tolist() == pytest.approx([10.0 + 4.0 / 3, 10.0])


@pytest.mark.parametrize("rule", ["median", "clipped_mean", "krum"])
def test_updates_read_lazily_combine_as_the_built_updates(rule):
    """OCFL hands the cluster aggregator its updates as `Differences` (trained minus start, built on demand): a
    rule combines them as it combines the same updates built, and leaves out a row of weight 0 alike."""
    g = torch.Generator().manual_seed(0)
    starts = torch.randn(5, generator=g).expand(7, 5)
    params = starts + torch.randn(7, 5, generator=g)
    clusters, weights = torch.tensor([0, 1, 0, 1, 0, 1, 0]), torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    found = []
    for values in (params - starts, Differences(params, starts)):
        aggregate = RobustClusterAggregate(
            AggregatorConfig(rule, f=0, clip=1.0), 2, 5, torch.float32, torch.device("cpu")
        )
        aggregate.add(clusters, weights, values)
        found.append(aggregate.means())
    assert torch.equal(found[0][0], found[1][0]) and torch.equal(found[0][1], found[1][1])


def test_personal_entries_count_in_no_distance():
    """Krum on models with a personal entry: the personal values (huge, different per client) must not decide."""
    starts = torch.zeros(5, 2)
    trained = torch.tensor([[0.0, 1e3], [1.0, -1e3], [2.5, 5e3], [3.0, 0.0], [50.0, 0.0]])
    aggregate = RobustClusterAggregate(
        AggregatorConfig("krum", f=1),
        1,
        2,
        torch.float32,
        torch.device("cpu"),
        personal_mask=torch.tensor([False, True]),
    )
    aggregate.add(torch.zeros(5, dtype=torch.long), torch.ones(5), trained, starts)
    assert aggregate.means()[1][0, 0].item() == 2.5


def test_a_held_rule_holds_the_round_and_says_why():
    fed = small_federation(FedAvg(), num_clients=5, rounds=1, aggregator="median")
    assert fed.execution.plan.updates == "hold"
    assert "median needs every update" in fed.execution.plan.describe()
    fed.run_round(1)
    streamed = small_federation(FedAvg(), num_clients=5, rounds=1, aggregator="clipped_mean")
    assert streamed.execution.plan.updates == "stream" and streamed.execution.plan.hold_reason is None


def test_median_of_one_cluster_run_equals_the_median_of_the_trained_models():
    """Independent of the rule's code path: the trained models' coordinate median worked directly (4 clients: the
    mean of the two middle values)."""
    held = small_federation(FedAvg(), num_clients=4, rounds=1, aggregator="median")
    start = held.algorithm.models[0].clone()
    round_updates = held.execution.round_updates(1, [0, 1, 2, 3])
    trained = round_updates.all().params
    held.algorithm.aggregate(1, round_updates)
    expected = start + (trained - start).sort(dim=0).values[1:3].mean(dim=0)
    assert torch.allclose(held.algorithm.models[0], expected, atol=1e-6)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"aggregator": "krum", "aggregator_f": 2}, "aggregator.f 2 is too large for krum with 6 clients"),
        ({"aggregator": "bulyan", "aggregator_f": 1}, "lower aggregator.f to 0"),
        ({"aggregator": "trimmed_mean", "aggregator_beta": 0.5}, "aggregator.beta must be in [0, 0.5)"),
        ({"aggregator": "mode"}, "aggregator.rule must be one of"),
        ({"aggregator": "krumm"}, "got 'krumm' (did you mean 'krum'?)"),
    ],
)
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        small_federation(FedAvg(), num_clients=6, rounds=1, **settings)


def test_an_algorithm_with_its_own_aggregation_refuses_a_robust_rule_after_round_1():
    fed = small_federation(Local(), num_clients=4, rounds=1, aggregator="median")
    with pytest.raises(
        ValueError,
        match="Local combined its clients' updates in round 1 without the engine's cluster "
        "aggregator, so aggregator.rule: median could not apply",
    ):
        fed.run_round(1)


@pytest.mark.parametrize(
    "former",
    [
        {},
        {
            "aggregator": "median",
            "aggregator_f": 1,
            "aggregator_beta": 0.1,
            "aggregator_clip": 1.0,
            "aggregator_keep": None,
        },
    ],
)
def test_a_run_folder_written_before_the_aggregator_section_resumes_with_its_settings(tmp_path, tiny_run_args, former):
    """Its config.yaml has no `aggregator:` section: none of the settings (older still: the mean is what it ran with),
    or the five `federation.aggregator*` keys they were (it ran with the median, and resumes with it)."""
    import yaml

    from fedlight.run.cli import main

    rule = former.get("aggregator", "mean")
    assert main(tiny_run_args + ["--run_name", "old", "--federation.rounds", "1", "--aggregator.rule", rule]) == 0
    config = tmp_path / "old" / "config.yaml"
    saved = yaml.safe_load(config.read_text())
    assert saved["aggregator"]["rule"] == rule
    saved.pop("aggregator"), saved.pop("attack"), saved.pop("privacy")
    saved["federation"].update(former)
    config.write_text(yaml.safe_dump(saved))
    assert main(["fit", "--resume", str(tmp_path / "old"), "--federation.rounds", "2"]) == 0
    assert yaml.safe_load(config.read_text())["aggregator"]["rule"] == rule  # rewritten in the current format
    other = "trimmed_mean" if rule == "median" else "median"
    assert (
        main(["fit", "--resume", str(tmp_path / "old"), "--federation.rounds", "3", "--aggregator.rule", other]) == 2
    )  # a setting it did not run with is still refused


def test_a_former_aggregator_key_is_told_its_new_name(tmp_path, tiny_run_args, capsys):
    from fedlight.run.cli import main

    assert main(tiny_run_args + ["--federation.aggregator", "median"]) == 2
    assert "--federation.aggregator is now --aggregator.rule" in capsys.readouterr().err
    config = tmp_path / "old.yaml"
    config.write_text("federation:\n  aggregator_f: 2\n")
    assert main(tiny_run_args + ["--config", str(config)]) == 2
    assert (
        f"config key federation.aggregator_f is now aggregator.f (the aggregator: section): move it there in "
        f"{config}" in capsys.readouterr().err
    )


def test_fedem_median_is_each_components_coordinate_median_of_the_clients_copies():
    """Three clients, two components: every component becomes the coordinate-wise middle value of the three
    clients' trained copies of it (worked directly on the copies, not on the updates), not their mean."""
    fed = small_federation(FedEM(num_components=2), num_clients=3, rounds=1, aggregator="median")
    alg = fed.algorithm
    round_updates = fed.execution.round_updates(1, [0, 1, 2])
    held = round_updates.all()
    copies = held.state["copies"].clone()  # (clients, components, d)
    alg.aggregate(1, round_updates)
    middle = copies.sort(dim=0).values[1]  # of 3 values the second smallest
    assert torch.allclose(alg.models, middle, atol=1e-6)
    sizes = held.num_samples.to(copies.dtype)
    mean = torch.einsum("c,cmd->md", sizes, copies) / sizes.sum()
    assert not torch.allclose(alg.models, mean, atol=1e-4)


class OwnMean(Algorithm):
    """The weighted mean of the trained models, summed by the algorithm itself: the engine's cluster aggregator is
    never asked for."""

    def aggregate(self, round, updates) -> None:
        sums, total = torch.zeros_like(self.models[0]), 0.0
        for group in updates.groups():
            weights = group.num_samples.to(sums.dtype)
            sums += weights @ group.params
            total += float(weights.sum())
        self.models[0] = sums / total


@pytest.mark.parametrize(
    "setting, named",
    [
        ({"aggregator": "median"}, "aggregator.rule: median"),
        ({"privacy": PrivacyConfig(noise_multiplier=1.0, clip=1.0)}, "the privacy section"),
    ],
)
def test_an_algorithm_that_bypasses_the_aggregator_is_stopped_after_round_1(setting, named):
    fed = small_federation(OwnMean(), num_clients=4, rounds=2, **setting)
    with pytest.raises(ValueError) as error:
        fed.run_round(1)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(
        f"OwnMean combined its clients' updates in round 1 without the engine's cluster "
        f"aggregator, so {named} could not apply: run OwnMean with aggregator.rule: mean"
    )
    assert "cluster_means" in message and "server.aggregation.new" in message


def test_an_algorithm_that_bypasses_the_aggregator_runs_with_the_default_mean():
    fed = small_federation(OwnMean(), num_clients=4, rounds=2)
    start = fed.algorithm.models[0].clone()
    fed.run_round(1)
    fed.run_round(2)
    assert not torch.equal(fed.algorithm.models[0], start)


def test_fedem_with_median_runs_its_rounds():
    fed = small_federation(FedEM(num_components=2), num_clients=4, rounds=2, aggregator="median")
    for round in (1, 2):
        result = fed.run_round(round)
    assert torch.isfinite(fed.algorithm.models).all() and "test/acc_mean" in result.scalars


class AveragesHalf(Algorithm):
    """Averages only the first half of the model's entries through the engine's aggregator and the rest itself: DP or
    a robust rule would protect half of each model."""

    def aggregate(self, round, updates) -> None:
        held = updates.all()
        half = self.models.shape[1] // 2
        average = self.server.aggregation.new(1, half, self.models.dtype, self.models.device)
        zeros = torch.zeros(len(held), dtype=torch.long, device=self.models.device)
        average.add(zeros, held.num_samples.to(self.models.dtype), held.params[:, :half], held.starts[:, :half])
        average.reduce(updates)
        _, means = average.means()
        self.models[0, :half] = means[0]
        self.models[0, half:] = held.params[:, half:].mean(dim=0)

    plan = Plan(holds_updates=True)


def test_an_algorithm_that_aggregates_part_of_the_model_its_own_way_is_stopped_after_round_1():
    fed = small_federation(AveragesHalf(), num_clients=4, rounds=2, aggregator="median")
    d = fed.flat.numel
    with pytest.raises(ValueError) as error:
        fed.run_round(1)
    assert str(error.value).startswith(
        f"AveragesHalf combined {d - d // 2:,} of the {d:,} shared entries of its "
        "clients' models in round 1 without the engine's cluster aggregator"
    )
    plain = small_federation(AveragesHalf(), num_clients=4, rounds=2)
    plain.run_round(1)  # the mean: nothing to apply


def test_a_rule_set_below_the_attackers_it_meets_is_named_with_its_fix():
    """20 % of 20 updates are 4 attackers: the trimmed mean at beta 0.1 trims 2 a side, Krum at f 1 tolerates 1, the
    median any minority (9 of 20); each count worked by hand, and the warning names the setting that makes it hold."""
    from fedlight.aggregators.config import AggregatorConfig, attackers_beyond_rule

    line = attackers_beyond_rule(AggregatorConfig(rule="trimmed_mean"), 0.2, 20)
    assert line is not None and "about 4 of the 20" in line and "withstands as set (2)" in line
    assert "aggregator.beta at least 0.2" in line
    assert attackers_beyond_rule(AggregatorConfig(rule="trimmed_mean", beta=0.2), 0.2, 20) is None
    assert "aggregator.f 4" in attackers_beyond_rule(AggregatorConfig(rule="krum"), 0.2, 20)
    assert attackers_beyond_rule(AggregatorConfig(rule="median"), 0.45, 20) is None  # 9 of 20: a minority
    assert "withstands as set (9)" in attackers_beyond_rule(AggregatorConfig(rule="median"), 0.5, 20)
    assert attackers_beyond_rule(AggregatorConfig(), 0.2, 20) is None  # the plain mean claims nothing
    assert attackers_beyond_rule(AggregatorConfig(rule="clipped_mean", clip=1.0), 0.2, 20) is None


def test_a_run_warns_when_its_attack_outnumbers_the_rule():
    from fedlight.aggregators.attacks import AttackConfig

    with pytest.warns(UserWarning, match=r"about 1 of the 6 updates .*trimmed_mean withstands as set \(0\)"):
        small_federation(FedAvg(), attack=AttackConfig(kind="sign_flip", fraction=0.2), aggregator="trimmed_mean")


def test_sign_flippers_shift_the_median_by_the_normal_quantile_and_multikrum_drops_them():
    """Why coordinate-wise rules lose accuracy on IID data under sign flips while Multi-Krum does not: with a share
    a of the rows far below the honest ones (mean mu, spread sigma), the median lands where the honest share below it
    is (1/2 - a) / (1 - a), at mu + sigma Phi^-1(0.375) = mu - 0.319 sigma for a = 0.2 (Phi^-1(0.375) = -0.3186, a
    normal table); every coordinate whose mean is smaller than that is pushed to the other sign. Multi-Krum's scores
    put the far rows last, so with f = the attackers it averages the honest rows only."""
    generator = torch.Generator().manual_seed(0)
    honest = 1.0 + 2.0 * torch.randn(4000, 3, generator=generator, dtype=torch.float64)  # mu 1, sigma 2
    flipped = -10.0 * (1.0 + 2.0 * torch.randn(1000, 3, generator=generator, dtype=torch.float64)).abs()
    rows = torch.cat([honest, flipped])
    assert torch.allclose(coordinate_median(rows), torch.full((3,), 1.0 - 0.3186 * 2.0, dtype=torch.float64), atol=0.1)
    assert torch.allclose(coordinate_median(honest), torch.ones(3, dtype=torch.float64), atol=0.1)
    small = torch.cat([honest[:16], flipped[:4]])  # a round of 20 clients, 4 attackers
    assert torch.allclose(multikrum(small, f=4), honest[:16].mean(dim=0))


def test_buckets_partition_the_rows_and_keep_the_weighted_mean():
    """Bucketing (Karimireddy, He, Jaggi, ICLR 2022): every row lands in exactly one bucket of `size` (the last one
    smaller), each bucket is its rows' weighted mean, and the buckets' weighted mean is the rows' weighted mean."""
    from fedlight.aggregators.robust import bucket_means

    x = torch.tensor([[1.0], [2.0], [4.0], [8.0], [16.0]], dtype=torch.float64)  # row i holds 2^i
    means, counts = bucket_means(x, torch.ones(5, dtype=torch.float64), 2, torch.Generator().manual_seed(3))
    # a bucket's sum of powers of two names its rows: its binary digits
    buckets = [{i for i in range(5) if round(float(m * n)) >> i & 1} for m, n in zip(means[:, 0], counts)]
    assert sorted(len(b) for b in buckets) == [1, 2, 2] and set().union(*buckets) == set(range(5))
    assert [len(b) for b in buckets] == counts.tolist()
    w = torch.tensor([1.0, 1.0, 2.0, 1.0, 3.0], dtype=torch.float64)
    means, weights = bucket_means(x, w, 2, torch.Generator().manual_seed(3))
    assert float((weights @ means[:, 0]) / weights.sum()) == pytest.approx(67.0 / 8.0)  # sum w_i x_i / sum w_i
    one, total = bucket_means(x, w, 5, torch.Generator().manual_seed(0))
    assert one.tolist() == [[67.0 / 8.0]] and total.tolist() == [8.0]  # one bucket: the weighted mean


def test_a_median_over_buckets_of_every_row_is_the_weighted_mean_update():
    starts = torch.tensor([[10.0, 10.0]] * 4)
    updates = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0], [90.0, 4.0]])
    aggregate = RobustClusterAggregate(
        AggregatorConfig("median", bucket=4), 1, 2, torch.float64, torch.device("cpu"), round=7
    )
    aggregate.add(torch.zeros(4, dtype=torch.long), torch.tensor([1.0, 1.0, 1.0, 1.0]), starts + updates, starts)
    assert aggregate.means()[1].tolist() == [[10.0 + 96.0 / 4, 11.0]]  # one bucket: start + the mean update


def test_bucketing_counts_attackers_in_buckets_and_is_refused_where_it_changes_nothing():
    """20 updates, 4 attackers: buckets of 2 give 10 rows of which at most 4 are spoiled, a minority for the median;
    buckets of 3 give 7 rows, 4 spoiled, a majority. Krum with f 4 needs 11 rows: 10 buckets are too few."""
    from fedlight.aggregators.cluster_aggregator import ClusterAggregation, check_aggregation
    from fedlight.aggregators.config import attackers_beyond_rule

    assert attackers_beyond_rule(AggregatorConfig(rule="median", bucket=2), 0.2, 20) is None
    line = attackers_beyond_rule(AggregatorConfig(rule="median", bucket=3), 0.2, 20)
    assert line is not None and "about 4 of the 7 buckets" in line and "withstands as set (3)" in line
    with pytest.raises(ValueError, match="20 clients a round in 10 buckets"):
        check_aggregation(ClusterAggregation(AggregatorConfig(rule="krum", f=4, bucket=2)), FedAvg(), 20)
    for rule in ("mean", "clipped_mean"):
        with pytest.raises(ValueError, match="aggregator.bucket 2 needs a rule that holds"):
            AggregatorConfig(rule=rule, bucket=2)
    with pytest.raises(ValueError, match="aggregator.bucket must be at least 1"):
        AggregatorConfig(rule="median", bucket=0)
