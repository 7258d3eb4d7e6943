"""OCFL, FLIS, IFCA and CFL against hand computations and constructed cases."""

import math

import numpy as np
import pytest
import torch

from fedlight import RoundUpdates
from fedlight.plugin.algorithm import Updates
from fedlight.algorithms.cfl import CFL
from fedlight.algorithms.flis import FlisDC, FlisHC
from fedlight.algorithms.ifca import IFCA
from fedlight.algorithms.ocfl import OCFL, temperature
from fedlight.datamodules import ClassesPerClient, Rotations

from helpers.federations import small_federation


def updates_from_deltas(deltas: torch.Tensor, start: torch.Tensor, sizes=None) -> Updates:
    n = len(deltas)
    starts = start.repeat(n, 1)
    sizes = torch.ones(n, dtype=torch.long) if sizes is None else torch.as_tensor(sizes)
    return Updates(torch.arange(n), starts + deltas, starts, sizes, torch.zeros(n))


# -- OCFL -------------------------------------------------------------------------------------------
def test_temperature_by_hand():
    # n = 2, p = 2: ||G|| = sqrt(1 + 1), lambda = sqrt(2 * 1 * 2^2) -> 0.5
    assert temperature(torch.tensor([[0.0, 1.0], [1.0, 0.0]])) == pytest.approx(0.5)
    # n = 3 with off-diagonal entries 0.5, 1, 2: sqrt(2 * (0.25 + 1 + 4)) / sqrt(3 * 2 * 4)
    g = torch.tensor([[0.0, 0.5, 1.0], [0.5, 0.0, 2.0], [1.0, 2.0, 0.0]])
    assert temperature(g) == pytest.approx(math.sqrt(10.5) / math.sqrt(24))
    # p = 1: (2 * 3.5) / (3 * 2 * 2)
    assert temperature(g, p=1) == pytest.approx(7 / 12)
    assert temperature(torch.full((4, 4), 2.0).fill_diagonal_(0)) == pytest.approx(1.0)


def first_firing_round(temps, **kwargs):
    alg = OCFL(**kwargs)
    for t, value in enumerate(temps, start=1):
        alg.temperatures.append(value)
        if alg.triggered():
            return t
    return None


def test_trigger_fires_at_the_first_round_whose_temperature_does_not_fall():
    temps = [0.9, 0.8, 0.7, 0.75, 0.6]
    assert first_firing_round(temps) == 4
    assert first_firing_round([0.9, 0.8, 0.8, 0.9]) == 4  # strict: a tie does not fire
    assert first_firing_round([0.9, 0.8, 0.8, 0.9], strict=False) == 3
    assert first_firing_round([0.5, 0.6]) == 2  # the earliest possible round
    # window 2: averages 0.9, 0.85, 0.75, 0.725, 0.675 (0.65+0.7)/2... computed by hand below
    temps = [0.9, 0.8, 0.7, 0.75, 0.6, 0.9]
    # moving averages of 2: r2 .85 (prev .9), r3 .75, r4 .725, r5 .675, r6 .75 -> first rise at round 6
    assert first_firing_round(temps, window=2) == 6


def test_ocfl_splits_on_a_block_structure_and_starts_children_from_the_parent():
    fed = small_federation(OCFL(min_rounds=1), num_clients=6)
    alg = fed.algorithm
    d = fed.flat.numel
    g = torch.Generator().manual_seed(0)
    direction = torch.randn(2, d, generator=g)
    deltas = torch.cat(
        [direction[0] + 0.01 * torch.randn(3, d, generator=g), direction[1] + 0.01 * torch.randn(3, d, generator=g)]
    )
    parent = alg.models[0].clone()
    alg.temperatures = [0.0]  # any temperature now is a rise: the shot fires
    alg.pre_aggregation(2, RoundUpdates.of(updates_from_deltas(deltas, parent)))
    labels = alg.cluster_labels()
    assert alg.clustered_round == 2 and len(set(labels[:3])) == 1 and len(set(labels[3:])) == 1
    assert labels[0] != labels[3]
    assert all(torch.equal(m, parent) for m in alg.models)


def test_ocfl_aggregates_unweighted_mean_deltas_with_the_server_lr():
    fed = small_federation(OCFL(server_lr=0.5), num_clients=3)
    alg = fed.algorithm
    d = fed.flat.numel
    start = alg.models[0].clone()
    deltas = torch.stack([torch.full((d,), 1.0), torch.full((d,), 2.0), torch.full((d,), 6.0)])
    alg.aggregate(1, RoundUpdates.of(updates_from_deltas(deltas, start, sizes=[100, 1, 1])))  # sizes are ignored
    assert torch.allclose(alg.models[0], start + 0.5 * 3.0)


@pytest.fixture
def no_delta_matrix(monkeypatch):
    """Building the full (clients x parameters) delta matrix raises: a hook must read the updates lazily."""

    def refuse(*args):
        raise AssertionError("built the full delta matrix")

    monkeypatch.setattr(Updates, "deltas", property(refuse))
    monkeypatch.setattr(Updates, "masked_deltas", refuse)


def two_cluster_round(alg, d: int, shared_start: bool) -> Updates:
    """Six clients in clusters 0, 1, 0, 1, 1, 0 (two cluster models) with random deltas; their starts are the one
    model expanded (stride 0) or each client's own cluster model, stacked."""
    g = torch.Generator().manual_seed(1)
    alg.models = torch.stack([alg.models[0], alg.models[0] + torch.randn(d, generator=g)])
    alg.assignment = torch.tensor([0, 1, 0, 1, 1, 0])
    starts = alg.models[0].clone().expand(6, d) if shared_start else alg.models[alg.assignment]
    params = starts + torch.randn(6, d, generator=g)
    return Updates(torch.arange(6), params, starts, torch.tensor([5, 1, 2, 7, 3, 4]), torch.zeros(6))


@pytest.mark.parametrize("shared_start", [True, False], ids=["stride-0 starts", "stacked starts"])
def test_ocfl_aggregates_without_a_delta_matrix_to_the_dense_reference_bit_for_bit(shared_start, no_delta_matrix):
    fed = small_federation(OCFL(server_lr=0.5), num_clients=6)
    alg = fed.algorithm
    d = fed.flat.numel
    updates = two_cluster_round(alg, d, shared_start)
    before = alg.models.clone()
    deltas = updates.params - updates.starts  # float32, as the dense path held them, then float64 sums
    expected = torch.stack(
        [before[k] + 0.5 * (deltas[alg.assignment == k].double().sum(0) / 3).float() for k in (0, 1)]
    )
    alg.aggregate(1, RoundUpdates.of(updates))
    assert torch.equal(alg.models, expected)


def test_ocfl_measures_the_masked_update_cosines_without_a_delta_matrix(no_delta_matrix):
    fed = small_federation(OCFL(), num_clients=6)
    alg = fed.algorithm
    d = fed.flat.numel
    alg.mask = torch.arange(d) % 3 != 1
    updates = two_cluster_round(alg, d, shared_start=True)
    alg.models = alg.models[:1]
    deltas = (updates.params.double() - updates.starts.double())[:, alg.mask]
    gamma = 1 - torch.nn.functional.cosine_similarity(deltas[:, None], deltas[None], dim=-1)
    alg.pre_aggregation(1, RoundUpdates.of(updates))
    assert alg.temperatures[-1] == pytest.approx(temperature(gamma.fill_diagonal_(0)), abs=1e-6)


def test_ocfl_places_a_client_absent_at_the_shot_by_its_masked_update_without_a_delta_matrix(no_delta_matrix):
    fed = small_federation(OCFL(), num_clients=6)
    alg = fed.algorithm
    d = fed.flat.numel
    alg.mask = torch.arange(d) >= d // 2  # cluster 0 and 1 differ on the masked half only
    g = torch.Generator().manual_seed(2)
    up, down = torch.randn(d, generator=g), torch.randn(d, generator=g)
    up[alg.mask], down[alg.mask] = 1.0, -1.0
    alg.models = alg.models[0].repeat(2, 1)
    alg.clustered_round = 1
    alg.assignment = torch.tensor([0, 0, 1, 1, 0, 0])
    alg.unassigned[:] = False
    alg.unassigned[torch.tensor([4, 5])] = True  # clients 4 and 5 were not there at the shot
    # client 4 follows cluster 1 on the masked half, but cluster 0 (ten times larger) on the other half
    follower = torch.where(alg.mask, down, 10 * up)
    directions = torch.stack([up, up, down, down, follower, up]) + 0.1 * torch.randn(6, d, generator=g)
    starts = alg.models[alg.assignment]
    alg.pre_aggregation(
        2,
        RoundUpdates.of(
            Updates(torch.arange(6), starts + directions, starts, torch.ones(6, dtype=torch.long), torch.zeros(6))
        ),
    )
    assert alg.assignment.tolist() == [0, 0, 1, 1, 1, 0] and not alg.unassigned.any()


# -- CFL --------------------------------------------------------------------------------------------
def opposed_deltas(d: int, scale: float = 1.0) -> torch.Tensor:
    v = torch.zeros(d)
    v[0] = scale
    w = torch.zeros(d)
    w[1] = 0.01
    return torch.stack([v + w, v - w, -v + w, -v - w])  # mean 0; two opposite pairs


def test_cfl_splits_when_the_mean_update_is_small_and_some_update_is_large():
    fed = small_federation(CFL(eps1=0.1, eps2=0.5, warmup_rounds=0), num_clients=4)
    alg = fed.algorithm
    alg.pre_aggregation(1, RoundUpdates.of(updates_from_deltas(opposed_deltas(fed.flat.numel), alg.models[0])))
    labels = alg.cluster_labels()
    assert labels[0] == labels[1] != labels[2] == labels[3]
    assert len(alg.models) == 2 and torch.equal(alg.models[0], alg.models[1])
    assert alg.split_rounds == [1]


@pytest.mark.parametrize(
    "settings, why",
    [
        ({"eps1": 0.1, "eps2": 5.0, "warmup_rounds": 0}, "no update exceeds eps2"),
        ({"eps1": 0.1, "eps2": 0.5, "warmup_rounds": 3}, "still warming up"),
        ({"eps1": 0.1, "eps2": 0.5, "warmup_rounds": 0, "min_cluster_size": 4}, "cluster too small"),
    ],
)
def test_cfl_does_not_split(settings, why):
    fed = small_federation(CFL(**settings), num_clients=4)
    alg = fed.algorithm
    alg.pre_aggregation(1, RoundUpdates.of(updates_from_deltas(opposed_deltas(fed.flat.numel), alg.models[0])))
    assert len(alg.models) == 1, why


def opposed_within_clusters(assignment: torch.Tensor, d: int) -> torch.Tensor:
    """Deltas whose mean is zero inside every cluster: members alternate between +v and -v (plus a small
    distinct component), so every cluster of more than two members meets the split criterion."""
    deltas = torch.zeros(len(assignment), d)
    for cluster in assignment.unique():
        members = (assignment == cluster).nonzero().flatten()
        for rank, i in enumerate(members.tolist()):
            deltas[i, 0] = 1.0 if rank % 2 == 0 else -1.0
            deltas[i, 1] = 0.01 if rank % 4 < 2 else -0.01
    return deltas


def test_cfl_cooldown_keeps_fresh_children_from_splitting_again():
    fed = small_federation(CFL(eps1=0.1, eps2=0.5, warmup_rounds=0, split_cooldown=3), num_clients=8)
    alg = fed.algorithm
    d = fed.flat.numel
    alg.pre_aggregation(
        1, RoundUpdates.of(updates_from_deltas(opposed_within_clusters(alg.assignment, d), alg.models[0]))
    )
    assert len(alg.models) == 2
    for round, expected in ((2, 2), (3, 2), (4, 4)):  # children born in round 1 may split from round 4 on
        deltas = opposed_within_clusters(alg.assignment, d)
        alg.pre_aggregation(round, RoundUpdates.of(updates_from_deltas(deltas, alg.models[0])))
        assert len(alg.models) == expected, round


def test_cfl_does_not_split_when_clients_agree():
    fed = small_federation(CFL(eps1=0.1, eps2=0.5, warmup_rounds=0), num_clients=4)
    alg = fed.algorithm
    same = opposed_deltas(fed.flat.numel).abs()  # all pointing the same way: mean norm ~1 > eps1
    alg.pre_aggregation(1, RoundUpdates.of(updates_from_deltas(same, alg.models[0])))
    assert len(alg.models) == 1


# -- IFCA -------------------------------------------------------------------------------------------
def constant_logit_model(fed, bias: torch.Tensor) -> torch.Tensor:
    """A flat model whose output is `bias` for every input: every weight zero, the last bias = `bias`."""
    params = torch.zeros(fed.flat.numel)
    last = [e for e in fed.flat.entries if e.name.endswith("bias")][-1]
    params[last.start : last.stop] = bias
    return params


def test_ifca_assigns_each_client_to_the_model_with_the_lowest_loss_computed_by_hand():
    fed = small_federation(IFCA(num_clusters=2), num_clients=5, partition=ClassesPerClient(2))
    alg = fed.algorithm
    biases = torch.stack([torch.linspace(2, -2, 10), torch.linspace(-2, 2, 10)])  # favour low / high digits
    alg.models = torch.stack([constant_logit_model(fed, b) for b in biases])
    expected_losses = np.zeros((2, 5))
    for k in range(5):
        _, y = fed.data.train.client(k)
        for j in range(2):
            log_p = biases[j] - torch.logsumexp(biases[j], 0)
            expected_losses[j, k] = -log_p[y].double().mean()
    assert np.allclose(fed.server.clients.losses(alg.models, "train").double().numpy(), expected_losses, atol=1e-5)
    alg.pick_clusters(list(range(5)))
    assert alg.assignment.tolist() == expected_losses.argmin(axis=0).tolist()


def test_ifca_cluster_models_start_from_different_initializations():
    fed = small_federation(IFCA(num_clusters=3), num_clients=3)
    m = fed.algorithm.models
    assert torch.equal(m[0], fed.server.model.initial_params) and not torch.equal(m[1], m[2])


# -- FLIS -------------------------------------------------------------------------------------------
def test_flis_dc_pool_is_the_size_weighted_mean_over_thresholded_similarity():
    fed = small_federation(FlisDC(beta=0.5), num_clients=3, public_size=30)
    alg = fed.algorithm
    d = fed.flat.numel
    params = torch.stack([torch.full((d,), v) for v in (1.0, 2.0, 4.0)])
    sizes = torch.tensor([1, 3, 1])
    similarity = torch.tensor([[1.0, 0.6, 0.1], [0.6, 1.0, 0.5], [0.1, 0.5, 1.0]])
    alg.similarity = lambda p: similarity
    alg.aggregate(1, RoundUpdates.of(Updates(torch.arange(3), params, params, sizes, torch.zeros(3))))
    # cluster 0 = {0, 1}: (1*1 + 3*2)/4; cluster 1 = {0, 1, 2} (0.5 >= beta joins): (1 + 6 + 4)/5; cluster 2 = {1, 2}
    expected = [(1 + 6) / 4, (1 + 6 + 4) / 5, (6 + 4) / 4]
    assert torch.allclose(alg.models, torch.tensor(expected)[:, None].expand(3, d))


def test_flis_needs_public_data():
    with pytest.raises(ValueError, match="public_size"):
        small_federation(FlisHC(), num_clients=3)


def test_flis_similarity_is_the_prediction_agreement_of_the_models():
    fed = small_federation(FlisDC(), num_clients=3, public_size=40)
    alg = fed.algorithm
    biases = [torch.eye(10)[c] * 5 for c in (3, 3, 7)]  # models predicting class 3, 3 and 7 everywhere
    models = torch.stack([constant_logit_model(fed, b) for b in biases])
    assert torch.allclose(alg.similarity(models), torch.tensor([[1.0, 1, 0], [1, 1, 0], [0, 0, 1]]))


def test_flis_hc_recovers_rotation_clusters_after_phase_zero():
    fed = small_federation(
        FlisHC(beta=0.3, phase_zero_epochs=10),
        num_clients=8,
        public_size=150,
        partition=Rotations(2),
        lr=0.05,
        momentum=0.9,
    )
    fed.run_round(1)
    labels = fed.algorithm.cluster_labels()
    truth = fed.data.cluster_labels
    from sklearn.metrics import adjusted_rand_score

    assert adjusted_rand_score(truth, labels) == 1.0
    assert not any(torch.equal(m, fed.server.model.initial_params) for m in fed.algorithm.models)  # trained in round 1


def test_the_logged_cluster_of_each_client_is_the_clustering_that_was_scored():
    """IFCA assigns only the selected clients during a round and every client when it is evaluated; the
    cluster column logged with the per-client metrics must still be the assignment the ARI was computed from."""
    from sklearn.metrics import adjusted_rand_score

    fed = small_federation(IFCA(num_clusters=3, participation=0.5), num_clients=8, partition=Rotations(2))
    for round in (1, 2, 3):
        metrics = fed.run_round(round)
        logged = metrics.per_client["cluster"]
        assert adjusted_rand_score(fed.data.cluster_labels, logged) == pytest.approx(metrics.scalars["cluster/ari"])


def test_ifca_evaluates_every_client_with_the_model_of_the_cluster_it_is_logged_with():
    """Recompute each client's accuracy with the model of its logged cluster, and its cluster by hand as the
    lowest-loss model: both must match what the round reported (before, IFCA reassigned clients while being
    evaluated, after its cluster column had been taken)."""
    fed = small_federation(IFCA(num_clusters=3, participation=0.5), num_clients=8, partition=Rotations(2))
    alg, server = fed.algorithm, fed.server
    for round in (1, 2, 3):
        metrics = fed.run_round(round)
        logged = metrics.per_client["cluster"]
        assert logged.tolist() == server.clients.losses(alg.models, "train").argmin(dim=0).tolist()
        for client in range(8):
            x, y = fed.data.test.client(client)
            accuracy = (server.model.predict(alg.models[int(logged[client])], x).argmax(dim=1) == y).float().mean()
            assert metrics.per_client["acc"][client] == pytest.approx(float(accuracy))


def digits_without_val(algorithm):
    from fedlight import Federation, FederationConfig
    from fedlight.datamodules import DigitsFederated
    from fedlight.models import Classifier, SmallCNN

    torch.manual_seed(0)
    return Federation(
        DigitsFederated(num_clients=3, val_fraction=0.0, public_size=30),
        Classifier(SmallCNN(1, 10, 8, width=8)),
        algorithm,
        FederationConfig(rounds=1, accelerator="cpu", vectorize=0),
    )


def test_flis_dc_refuses_clients_without_a_selection_split_and_names_the_fix():
    """Before, FLIS-DC crashed in round 1 (torch.cat of an empty list) when no client had validation data."""
    with pytest.raises(ValueError, match=r"3 of 3 clients have no 'val' samples.*val_fraction.*selection_split: train"):
        digits_without_val(FlisDC())


def test_flis_dc_selects_by_the_training_split_when_asked():
    fed = digits_without_val(FlisDC(selection_split="train"))
    assert fed.run_round(1).scalars["clients_trained"] == 3


def test_predict_on_no_rows_and_losses_of_clients_without_rows():
    from fedlight.algorithms.fedavg import FedAvg

    fed = digits_without_val(FedAvg())
    server = fed.server
    assert server.model.predict(server.model.initial_params, fed.data.val.x).shape == (0, 10)
    models = server.model.initial_params[None]
    assert torch.isnan(server.clients.losses(models, "val")).all()  # no rows: no loss, rather than 0
    assert torch.isfinite(server.clients.losses(models, "train")).all()
