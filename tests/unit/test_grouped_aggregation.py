"""Aggregation by running sums: a round's updates handed over a group of clients at a time must give the same
models as all at once, and no group may hold more clients than the group size."""

import numpy as np
import pytest
import torch

from fedlight.plugin.aggregation import ClientModels, ClusterAverage
from fedlight.plugin.algorithm import Algorithm, Plan
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer

from helpers.federations import every_row, small_federation


class AllAtOnce(FedAvg):
    """FedAvg that declares it holds its updates, so the engine hands it the whole round at once."""

    plan = Plan(holds_updates=True)


def test_cluster_average_over_groups_is_the_weighted_mean_by_hand():
    average = ClusterAverage(2, 1, torch.float64, torch.device("cpu"))
    average.add(torch.tensor([0, 1]), torch.tensor([1.0, 3.0]), torch.tensor([[2.0], [10.0]], dtype=torch.float64))
    average.add(torch.tensor([0, 0]), torch.tensor([2.0, 1.0]), torch.tensor([[5.0], [8.0]], dtype=torch.float64))
    active, means = average.means()
    assert active.tolist() == [0, 1]
    assert means[:, 0].tolist() == pytest.approx([(1 * 2 + 2 * 5 + 1 * 8) / 4, 10.0])


def test_cluster_average_over_many_column_blocks_is_the_weighted_mean_of_numpy(monkeypatch):
    """Sums and means taken a block of columns at a time (here 3 columns, 7 blocks and a short one) are the weighted
    means of every column, in the rows' dtype, with a cluster left out."""
    monkeypatch.setattr(ClusterAverage, "CACHE_BYTES", 8 * 3 * 4)  # 3 columns of 4 rows a block
    rows = torch.randn(4, 22, generator=torch.Generator().manual_seed(0))
    clusters, weights = torch.tensor([0, 2, 0, 2]), torch.tensor([1.0, 2.0, 3.0, 0.5])
    average = ClusterAverage(3, 22, torch.float32, torch.device("cpu"))
    average.add(clusters, weights, rows)
    active, means = average.means()
    x, w = rows.double().numpy(), weights.double().numpy()
    expected = [(w[[0, 2], None] * x[[0, 2]]).sum(0) / 4.0, (w[[1, 3], None] * x[[1, 3]]).sum(0) / 2.5]
    assert active.tolist() == [0, 2] and means.dtype == torch.float32
    assert torch.allclose(means, torch.tensor(np.stack(expected), dtype=torch.float32), atol=1e-6, rtol=0)


def test_cluster_average_leaves_out_clusters_without_weight():
    average = ClusterAverage(3, 2, torch.float32, torch.device("cpu"))
    average.add(torch.tensor([2]), torch.tensor([5.0]), torch.ones(1, 2))
    assert average.means()[0].tolist() == [2]


def test_which_algorithms_take_their_updates_in_groups():
    for algorithm, plan in ((FedAvg(), "stream"), (FedPer(), "stream"), (Algorithm(), "stream"), (AllAtOnce(), "hold")):
        assert small_federation(algorithm, num_clients=2).execution.plan.updates == plan


def test_groups_never_exceed_the_group_size_and_cover_every_selected_client_once():
    fed = small_federation(FedAvg(), num_clients=7, vectorize=3)
    groups, train = [], fed.execution.train

    def recording(round, clients):
        groups.append(list(clients))
        return train(round, clients)

    fed.execution.train = recording
    fed.run_round(1)
    assert [len(g) for g in groups] == [3, 3, 1]
    assert sorted(c for g in groups for c in g) == list(range(7))


@pytest.mark.parametrize("vectorize", [0, 3])
def test_grouped_fedavg_equals_fedavg_on_the_whole_round(vectorize):
    grouped = small_federation(FedAvg(), num_clients=7, vectorize=vectorize or 3)
    whole = small_federation(AllAtOnce(), num_clients=7, vectorize=vectorize or 3)
    if vectorize == 0:  # sequential training, grouped aggregation (the group size still comes from `vectorize`)
        grouped.execution.vectorized = whole.execution.vectorized = None
    for r in (1, 2):
        a, b = grouped.run_round(r), whole.run_round(r)
        assert a.scalars["train/loss"] == pytest.approx(b.scalars["train/loss"], rel=1e-6)
    torch.testing.assert_close(grouped.algorithm.models, whole.algorithm.models, rtol=1e-5, atol=1e-6)


def test_grouped_fedper_keeps_the_same_personal_parts_as_whole_rounds():
    class FedPerAllAtOnce(FedPer):
        plan = Plan(holds_updates=True)

    grouped = small_federation(FedPer(personal_layers=1), num_clients=5, vectorize=2)
    whole = small_federation(FedPerAllAtOnce(personal_layers=1), num_clients=5, vectorize=2)
    for r in (1, 2):
        grouped.run_round(r), whole.run_round(r)
    torch.testing.assert_close(
        every_row(grouped.algorithm.personal), every_row(whole.algorithm.personal), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(grouped.algorithm.models, whole.algorithm.models, rtol=1e-5, atol=1e-6)


def test_personalized_clients_are_evaluated_one_model_at_a_time():
    fed = small_federation(FedPer(personal_layers=1), num_clients=4)
    fed.run_round(1)
    models, groups = fed.algorithm.evaluation_models()
    assert isinstance(models, ClientModels) and len(models) == 4 and groups.tolist() == [0, 1, 2, 3]
    shared = ~fed.algorithm.personal_mask
    for c in range(4):  # each client's model: the global shared part with its own personal part
        assert torch.equal(models[c][shared], fed.algorithm.models[0][shared])
        assert torch.equal(models[c][~shared], fed.algorithm.personal[c])
    with pytest.raises(IndexError):
        models[4]
    # evaluating through the lazy models equals evaluating a stacked tensor of the same models
    stacked = torch.stack([models[c] for c in range(4)])
    fed.algorithm.evaluation_models = lambda: (stacked, groups)
    lazy = small_federation(FedPer(personal_layers=1), num_clients=4)
    lazy.run_round(1)
    on_demand, stacked_result = lazy.evaluate()[1], fed.evaluate()[1]
    for metric in ("acc", "loss"):
        assert on_demand[metric].tolist() == pytest.approx(stacked_result[metric].tolist())


def test_automatic_group_size_follows_free_memory(monkeypatch):
    import fedlight.engine.group_training as execution

    fed = small_federation(FedAvg(), num_clients=7, vectorize=-1)
    activations = 5 * fed.flat.numel * 4
    monkeypatch.setattr(execution.GroupTraining, "activation_bytes", lambda self: activations)
    per_client = fed.flat.numel * 4 * 8 + 2 * activations  # params, grads, state, temporaries; activations twice
    monkeypatch.setattr(execution, "available_memory", lambda device: 2 * 3 * per_client)  # half holds 3
    assert fed.execution.group_size(7) == 3
    monkeypatch.setattr(execution, "available_memory", lambda device: 2 * 3 * fed.flat.numel * 4 * 8)
    assert fed.execution.group_size(7) == 1  # what the parameters alone would fit 3 of
    monkeypatch.setattr(execution, "available_memory", lambda device: 10**15)
    assert fed.execution.group_size(7) == 7 and fed.execution.group_size(1000) == execution.CPU_GROUP
    monkeypatch.setattr(execution, "available_memory", lambda device: None)  # unknown: the CPU cap only
    free = execution.available_memory(torch.device("cpu"))
    assert fed.execution.group_size(7) == 7 and (free is None or free > 0)


def test_a_client_step_keeps_its_activations_measured_by_hand():
    """An MLP 64 -> h -> 10 on a batch of 10: widening the hidden layer by 32 keeps 10 x 32 more fp32 values (the
    ReLU's output, which the next layer saves too: counted once); a BatchNorm's statistics do not move."""
    from fedlight import Federation, FederationConfig
    from fedlight.datamodules import DigitsFederated
    from fedlight.models import MLP, Classifier

    def measured(network: torch.nn.Module) -> int:
        config = FederationConfig(rounds=1, batch_size=10, accelerator="cpu", vectorize=-1)
        fed = Federation(DigitsFederated(num_clients=3), Classifier(network), FedAvg(), config)
        before = fed.flat.vector.clone()
        kept = fed.execution.activation_bytes()
        assert torch.equal(fed.flat.vector, before)
        return kept

    narrow, wide = measured(MLP(64, [32], 10)), measured(MLP(64, [64], 10))
    assert wide - narrow == 10 * 32 * 4
    assert narrow >= 10 * (64 + 32 + 10) * 4  # at least the input, the hidden layer and the log-probabilities
    normed = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )
    assert measured(normed) > narrow  # BatchNorm's input is kept besides; the buffer check ran inside


def test_a_step_that_cannot_be_measured_counts_no_activations(monkeypatch):
    """Measuring the activations runs the module's training_step once; if that fails, the group is sized from the
    parameters as before (the vectorized path then reports its own failure), not the run stopped."""
    import fedlight.engine.group_training as execution
    from fedlight.training.vectorized import VectorizedTrainer

    def broken(self, x, y):
        raise RuntimeError("this step cannot run outside the trainer")

    monkeypatch.setattr(VectorizedTrainer, "activation_bytes", broken)
    fed = small_federation(FedAvg(), num_clients=7, vectorize=-1)
    monkeypatch.setattr(execution, "available_memory", lambda device: 2 * 3 * fed.flat.numel * 4 * 8)
    assert fed.execution.activation_bytes() == 0 and fed.execution.group_size(7) == 3
