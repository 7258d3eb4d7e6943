"""FedFomo: the first-order weights and the combined model against hand computations on 2-parameter models, the
epsilon-greedy download, a 2-round run checked client by client against the paper's update worked out here, the
training rows held out for validation when the data has no val split, and bad options."""

import math

import numpy as np
import pytest
import torch

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedfomo import FedFomo, epsilon_greedy, first_order_update, first_order_weights
from fedlight.datamodules import DigitsFederated, Rotations
from fedlight.models import Classifier, SmallCNN

from helpers.federations import every_row, small_federation


def test_weights_and_combined_model_of_three_two_parameter_models_by_hand():
    """Own model (1, 1) with loss 1.0. a = (4, 5): distance 5, loss 0.5 -> (1 - 0.5) / 5 = 0.1; b = (1, 2): distance
    1, loss 0.8 -> 0.2; c = (2, 1): distance 1, loss 1.5 -> -0.5, clipped to 0. Normalized: 1/3, 2/3, 0; the
    combined model (1, 1) + (3, 4) / 3 + 2 (0, 1) / 3 = (2, 3)."""
    own, others = torch.tensor([1.0, 1.0]), torch.tensor([[4.0, 5.0], [1.0, 2.0], [2.0, 1.0]])
    signed, weights = first_order_weights(own, torch.tensor(1.0), others, torch.tensor([0.5, 0.8, 1.5]))
    assert torch.allclose(signed, torch.tensor([0.1, 0.2, -0.5]))
    assert torch.allclose(weights, torch.tensor([1 / 3, 2 / 3, 0.0]))
    assert torch.allclose(first_order_update(own, others, weights), torch.tensor([2.0, 3.0]))


def test_no_better_model_keeps_the_own_model_and_an_equal_model_weighs_nothing():
    """Losses no lower than the own model's (and a received model equal to it, 0 / 0) give no weight: the client
    keeps its model exactly."""
    own, others = torch.tensor([1.0, -2.0]), torch.tensor([[3.0, 0.0], [1.0, -2.0]])
    signed, weights = first_order_weights(own, torch.tensor(0.7), others, torch.tensor([0.9, 0.7]))
    assert torch.allclose(signed, torch.tensor([-0.2 / math.sqrt(8), 0.0])) and signed[1] == 0
    assert torch.equal(weights, torch.zeros(2)) and torch.equal(first_order_update(own, others, weights), own)


def test_epsilon_greedy_takes_the_highest_affinity_or_explores():
    affinity = np.array([9.0, 5.0, -1.0, 3.0, 2.0])  # client 0 is the receiver, not a candidate
    candidates = np.array([1, 2, 3, 4])
    for seed in range(5):
        assert epsilon_greedy(affinity, candidates, 2, 0.0, np.random.default_rng(seed)) == [1, 3]
    explored = [epsilon_greedy(affinity, candidates, 2, 1.0, np.random.default_rng(seed)) for seed in range(20)]
    assert all(len(set(p)) == 2 and set(p) <= {1, 2, 3, 4} for p in explored)
    assert len({tuple(p) for p in explored}) > 3  # random picks, not the greedy pair
    assert sorted(epsilon_greedy(affinity, candidates, 9, 0.5, np.random.default_rng(0))) == [1, 2, 3, 4]


def test_two_rounds_combine_each_client_by_its_validation_losses_then_train():
    """Round 1: no client has a model to send, so each trains its own. Round 2, client by client: the models it
    receives, weighed by hand from their losses on its val split (the module's cross-entropy, computed here), give
    the start of its training; its row of P holds the signed weights. Every client is evaluated with its model."""
    fed = small_federation(FedFomo(M=3, epsilon=0.0), num_clients=4)
    alg = fed.algorithm
    assert alg.validation == "val"
    fed.run_round(1)
    assert torch.equal(every_row(alg.affinity), torch.zeros(4, 4))
    before = every_row(alg.local_models).double()
    received = alg.download(2, [0, 1, 2, 3])
    assert all(sorted(ids) == sorted({0, 1, 2, 3} - {c}) for c, ids in enumerate(received))
    fed.run_round(2)
    positive = 0
    for client, ids in enumerate(received):
        x, y = fed.server.clients.split("val").client(client)
        loss = torch.stack(
            [
                torch.nn.functional.cross_entropy(fed.server.model.predict(before[m].float(), x), y)
                for m in (client, *ids)
            ]
        ).double()
        signed = [(loss[0] - loss[k + 1]) / (before[n] - before[client]).norm() for k, n in enumerate(ids)]
        kept = [max(0.0, float(w)) for w in signed]
        start = (
            before[client] + sum(w / sum(kept) * (before[n] - before[client]) for w, n in zip(kept, ids))
            if sum(kept) > 0
            else before[client]
        )
        positive += sum(w > 0 for w in kept) > 1 and min(kept) == 0  # two models weighed and one left out
        expected_row = torch.zeros(4, dtype=torch.float64)
        expected_row[ids] = torch.stack(signed)
        assert torch.allclose(alg.affinity[client].double(), expected_row, atol=1e-5), client
        trained = fed.server.clients.train(2, client, start.float()).params
        assert torch.allclose(alg.local_models[client], trained, atol=1e-5), client
    assert positive  # the case the update is about happened at least once
    models, groups = alg.evaluation_models()
    assert torch.equal(groups, torch.arange(4)) and torch.equal(models[2], alg.local_models[2])


def test_without_a_val_split_a_fixed_share_of_training_rows_validates_and_does_not_train():
    torch.manual_seed(0)
    data = DigitsFederated(num_clients=3, partition=Rotations(2), val_fraction=0.0)
    settings = FederationConfig(rounds=2, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=0)
    fed = Federation(data, Classifier(SmallCNN(1, 10, 8, width=8), lr=0.1), FedFomo(M=2), settings, seed=0)
    alg = fed.algorithm
    assert alg.validation == "train"
    n = int(fed.server.clients.train_sizes[0])
    held = alg.held_out_rows(0)
    assert len(held) == round(0.2 * n) == len(set(held.tolist())) and torch.equal(held, alg.held_out_rows(0))
    x, y = fed.server.clients.split("train").client(0)
    by_hand = torch.nn.functional.cross_entropy(fed.server.model.predict(alg.client_model(0), x[held]), y[held])
    assert torch.allclose(alg.losses(alg.client_model(0), [0])[0], by_hand, atol=1e-6)
    first = fed.execution.train(1, [0]).params
    labels = fed.server.clients.split("train").y
    labels[held] = (labels[held] + 1) % 10  # client 0's rows come first: its held-out rows' labels change
    assert torch.equal(fed.execution.train(1, [0]).params, first)  # they take no part in training
    trains = int(np.setdiff1d(np.arange(n), held.numpy())[0])
    labels[trains] = (labels[trains] + 1) % 10
    assert not torch.equal(fed.execution.train(1, [0]).params, first)  # a training row does
    fed.run_round(1), fed.run_round(2)
    assert torch.isfinite(every_row(alg.affinity)).all() and every_row(alg.affinity).abs().sum() > 0


def test_a_rounds_loss_passes_cover_its_clients_validation_rows_once_per_model_they_need():
    """2 of 6 clients a round: in round 3 each of the two computes 1 + M losses (its own model's and those of the M it
    receives, of clients trained in rounds 1-2), passes over its val rows alone, whatever the other clients."""
    fed = small_federation(FedFomo(M=2), num_clients=6, rounds=3, clients_per_round=2)
    fed.run_round(1), fed.run_round(2)
    rows: list[int] = []
    population = fed.server.clients
    sample_loss = population.sample_loss
    population.sample_loss = lambda params, x, y: rows.append(len(x)) or sample_loss(params, x, y)
    cohort = fed.algorithm.select_clients(3)
    fed.execution.train(3, cohort)
    stored = set(fed.algorithm.local_models.touched().tolist())  # the clients trained in rounds 1 and 2
    expected = sum((1 + min(2, len(stored - {c}))) * fed.server.clients.split("val").size(c) for c in cohort)
    assert len(stored) >= 3 and sum(rows) == expected


@pytest.mark.parametrize(
    "options, named",
    [
        ({"M": 0}, "M must be an integer >= 1"),
        ({"M": 2.5}, "M must be an integer >= 1"),
        ({"epsilon": 1.5}, r"epsilon must be in \[0, 1\]"),
        ({"epsilon": -0.1}, r"epsilon must be in \[0, 1\]"),
        ({"epsilon_decay": -0.05}, "epsilon_decay must be >= 0"),
        ({"val_share": 1.0}, r"val_share must be in \(0, 1\)"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, named):
    with pytest.raises(ValueError, match=named) as error:
        FedFomo(**options)
    assert "\n" not in str(error.value)
