"""Client selection as a plug-in choice: each selector against a hand-built case (power-of-choice's highest-loss
candidates, Oort's utility, each cluster's share by largest remainder), data-size selection's frequencies, and the
uniform selector drawing what a run without a `system:` section draws."""

import numpy as np
import pytest

from fedlight.plugin.server import stream_seed
from fedlight.system.cluster_stratified import ClusterStratified, largest_remainder
from fedlight.system.oort import Oort
from fedlight.system.power_of_choice import PowerOfChoice
from fedlight.system.selection import DataSize, SelectionContext, Uniform


def context(losses=(), sizes=None, times=None, clusters=None, asked=None) -> SelectionContext:
    """A run's facts for the selectors: losses by client (the clients asked are appended to `asked`)."""
    table = np.asarray(losses, dtype=float)

    def measured(clients):
        if asked is not None:
            asked.append(sorted(int(c) for c in clients))
        return table[clients], 2 * table[clients]

    n = len(table) if len(table) else len(sizes if sizes is not None else clusters)
    return SelectionContext(
        lambda round, purpose: np.random.default_rng(stream_seed(0, round, purpose)),
        np.ones(n) if sizes is None else np.asarray(sizes, dtype=float),
        np.ones(n) if times is None else np.asarray(times, dtype=float),
        measured,
        lambda: np.asarray(clusters),
    )


def test_power_of_choice_picks_the_highest_loss_candidates_and_measures_the_candidates_alone():
    asked: list = []
    losses = [0.1, 0.9, 0.5, 0.7, 0.2, 0.8, 3.0]  # client 6 is offline: never a candidate
    chooser = PowerOfChoice(context(losses, asked=asked), wanted=6)
    assert chooser.select(1, np.arange(6), 3) == [1, 3, 5]
    assert asked == [[0, 1, 2, 3, 4, 5]]
    asked.clear()
    few = PowerOfChoice(context(losses, sizes=[1, 1, 1, 1, 1, 1, 1], asked=asked), wanted=4).select(2, np.arange(6), 2)
    candidates = asked[0]
    assert len(candidates) == 4 and few == sorted(sorted(candidates, key=lambda c: -losses[c])[:2])


def test_power_of_choice_draws_its_candidates_in_proportion_to_data_size():
    sizes = [1, 1, 1, 0, 97]  # client 3 has no training data: it counts one sample
    chooser = PowerOfChoice(context([1.0] * 5, sizes=sizes, asked=(asked := [])), wanted=1)
    for round in range(1, 201):
        chooser.select(round, np.arange(5), 1)
    share = np.mean([a == [4] for a in asked])
    assert share == pytest.approx(97 / 101, abs=0.04)


def test_oort_multiplies_statistical_utility_by_the_penalty_of_clients_slower_than_the_preferred_time():
    # |B| sqrt(mean loss^2) (here 2 x the loss table) x (T / t)^alpha past T = 10 s
    sizes, losses, times = [10, 20, 40, 5], [1.0, 1.0, 1.0, 4.0], [5.0, 20.0, 40.0, 10.0]
    chooser = Oort(context(losses, sizes=sizes, times=times), wanted=4, alpha=2.0, preferred_s=10.0)
    utility = chooser.utility(np.arange(4), 2 * np.asarray(losses))
    assert utility.tolist() == pytest.approx([20.0, 40 * 0.25, 80 * 0.0625, 40.0])
    assert chooser.select(1, np.arange(4), 2) == [0, 3]


def test_cluster_stratified_gives_each_cluster_its_share_of_the_cohort_by_largest_remainder():
    assert largest_remainder(5, np.array([6, 3, 1])).tolist() == [3, 2, 0]  # 3, 1.5, 0.5: the tie to the first
    assert largest_remainder(4, np.array([5, 3, 2])).tolist() == [2, 1, 1]  # 2, 1.2, 0.8
    clusters = np.array([0] * 6 + [1] * 3 + [2] * 1 + [1] * 5)  # clients 10-14 (cluster 1) are offline
    chooser = ClusterStratified(context(sizes=np.ones(15), clusters=clusters))
    for round in range(1, 6):
        chosen = chooser.select(round, np.arange(10), 5)
        assert np.bincount(clusters[chosen], minlength=3).tolist() == [3, 2, 0]


def test_data_size_selection_picks_clients_in_proportion_to_their_data():
    chooser = DataSize(context(sizes=[1, 3]))
    picks = [chooser.select(round, np.arange(2), 1)[0] for round in range(1, 501)]
    assert np.mean(picks) == pytest.approx(0.75, abs=0.06)


def test_uniform_selection_of_every_client_available_draws_what_the_base_class_draws_without_a_system():
    chooser = Uniform(context(sizes=np.ones(20)))
    for round in (1, 2, 7):
        base = sorted(np.random.default_rng(stream_seed(0, round, "select")).choice(20, size=5, replace=False).tolist())
        assert chooser.select(round, np.arange(20), 5) == base


@pytest.mark.parametrize("size_weighted", [False, True])
def test_clients_sampled_by_size_are_averaged_plainly_unless_asked(size_weighted):
    """Sampling by size and weighting by size again counts a large client twice: after a FedAvg round with
    `selection: data_size` the global model is the plain mean of the trained models (Li et al.'s scheme I), or their
    size-weighted mean with `size_weighted_mean: true`; computed here from the round's trained rows."""
    import torch

    from fedlight import Plan, RoundUpdates
    from fedlight.algorithms.fedavg import FedAvg
    from fedlight.datamodules import QuantitySkew
    from fedlight.system.config import SystemConfig
    from helpers.federations import small_federation

    class Recording(FedAvg):
        plan = Plan(holds_updates=True)

        def aggregate(self, round: int, updates: RoundUpdates) -> None:
            self.trained = [(g.params.double().clone(), g.clients.clone()) for g in updates.groups()]
            super().aggregate(round, updates)

    system = SystemConfig(selection="data_size", size_weighted_mean=size_weighted)
    fed = small_federation(
        Recording(), num_clients=6, rounds=1, system=system, clients_per_round=3, partition=QuantitySkew(min_size=40)
    )
    fed.run_round(1)
    rows = torch.cat([params for params, _ in fed.algorithm.trained])
    clients = torch.cat([ids for _, ids in fed.algorithm.trained])
    sizes = fed.server.clients.train_sizes[clients].double()
    assert len(set(sizes.tolist())) > 1  # clients of different sizes: the two means differ
    weights = sizes if size_weighted else torch.ones_like(sizes)
    expected = (weights[:, None] * rows).sum(dim=0) / weights.sum()
    assert torch.allclose(fed.algorithm.models[0].double(), expected, atol=1e-6)
