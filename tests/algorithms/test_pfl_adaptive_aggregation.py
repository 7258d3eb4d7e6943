"""FedALA (adaptive local aggregation) against hand computations: one step of the aggregation weights W on softmax
regression (its gradient written out in helpers.softmax_regression), the start of local training mixed by hand on the
top layer with the global model below it, the evaluated models at W = 1 and W = 0, the stopping rule of a client's
first W learning on scripted losses, and its sample's size."""

import pytest
import torch

from fedlight.algorithms.fedala import FedALA
from fedlight.datamodules import QuantitySkew

from helpers.federations import small_federation
from helpers.softmax_regression import client_data, linear_federation, linear_gradient

#: a small sample and a first W learning of 3 passes (the stopping rule has a test of its own)
QUICK = {"rand_percent": 20, "num_pre_loss": 2, "threshold": 1e9}


def test_one_w_step_is_minus_eta_times_the_gradient_times_global_minus_local_clipped():
    # one batch holds the whole sample (s = 100 %): the step's gradient is the client's full-data gradient
    fed = linear_federation(FedALA(eta=50.0, rand_percent=100), num_clients=3, batch_size=4096)
    alg, generator = fed.algorithm, torch.Generator().manual_seed(1)
    assert bool(alg.mixed.all())  # softmax regression is one layer: p = 1 mixes every parameter
    received = fed.server.model.initial_params.clone()  # Theta
    local = received + 0.5 * torch.randn(len(received), generator=generator)  # theta
    start = torch.rand(len(received), generator=generator)  # W before the step
    weights, passes = alg.learn_weights(1, [1], received[None], local[None], start[None], torch.tensor([True]))
    mixed = local.double() + (received.double() - local.double()) * start.double()  # theta + (Theta - theta) W
    grad = linear_gradient(mixed, *client_data(fed, 1))
    expected = (start.double() - 50.0 * grad * (received.double() - local.double())).clamp(0, 1)
    assert passes.tolist() == [1.0]  # W learned before: one pass, here one batch
    assert torch.allclose(weights[0].double(), expected, rtol=0, atol=1e-5)
    inside = (expected > 0) & (expected < 1)
    assert (expected == 0).any() and (expected == 1).any() and inside.any()  # both clips and a free step


def test_evaluating_after_ala_learns_w_afresh_from_the_current_global_model_and_keeps_nothing():
    """PFLlib's evaluation (`evaluate_after_ala`): after round 2, client 1 (W learned before: one pass, its whole data
    one batch) is evaluated with theta + (Theta - theta) W', W' = clip(W - eta * grad * (Theta - theta)) at the new
    global model Theta, the gradient worked out for softmax regression; its stored W stays the round's."""
    fed = linear_federation(FedALA(eta=50.0, rand_percent=100, evaluate_after_ala=True), num_clients=3, batch_size=4096)
    fed.run_round(1), fed.run_round(2)
    alg = fed.algorithm
    received, local, stored = alg.models[0].double(), alg.local[1].double(), alg.weights[1].clone()
    mixed = local + (received - local) * stored.double()
    grad = linear_gradient(mixed, *client_data(fed, 1))
    relearned = (stored.double() - 50.0 * grad * (received - local)).clamp(0, 1)
    models, _ = alg.evaluation_models()
    assert torch.allclose(models[1].double(), local + (received - local) * relearned, rtol=0, atol=1e-5)
    assert not torch.allclose(relearned, stored.double(), atol=1e-3)  # W moved: the global model changed
    assert torch.equal(alg.weights[1], stored)  # nothing learned at evaluation is kept


@pytest.fixture(scope="module")
def two_rounds():
    """A 2-round run, half the clients a round: (the federation, round 2's clients, their theta_i and the global model
    before round 2, the models their local training started from in round 2)."""
    fed = small_federation(FedALA(participation=0.5, **QUICK), num_clients=4, rounds=2)
    alg, server = fed.algorithm, fed.server
    fed.run_round(1)  # theta_i = Theta = the initial model: ALA skipped, every client trains from Theta
    clients = alg.select_clients(2)
    local, received = alg.local.read(clients).clone(), alg.models[0].clone()
    starts, train_many = [], server.clients.train_many
    server.clients.train_many = lambda round, group, begin, *args, **kwargs: (
        starts.append(begin.clone()),
        train_many(round, group, begin, *args, **kwargs),
    )[1]
    fed.run_round(2)
    del server.clients.train_many
    return fed, clients, local, received, torch.cat(starts)


def test_local_training_starts_from_the_hand_mix_on_the_top_layer_and_the_global_model_below(two_rounds):
    fed, clients, local, received, starts = two_rounds
    alg, server = fed.algorithm, fed.server
    top = alg.mixed
    assert torch.equal(top, server.model.layer_mask(server.model.layers()[-1:]))  # p = 1: SmallCNN's fc
    assert torch.equal(starts[:, ~top], received[~top].expand(len(clients), -1))  # the global model whole below
    weights = alg.weights.read(clients)  # as the clients learned and used them in round 2
    hand = local + (received[top] - local) * weights  # theta + (Theta - theta) W
    assert torch.allclose(starts[:, top], hand, rtol=0, atol=1e-6)
    assert (weights < 1).any() and torch.equal(alg.weights_learned.read(clients), torch.ones(len(clients)))


def test_clients_are_evaluated_with_the_global_model_at_w_one_and_their_local_top_layer_at_w_zero(two_rounds):
    fed, clients, *_ = two_rounds
    alg = fed.algorithm
    top, received = alg.mixed, alg.models[0]
    models, _ = alg.evaluation_models()
    never = sorted(set(range(4)) - set(alg.local.touched().tolist()))
    assert never and all(torch.equal(models[c], received) for c in never)  # never selected: the global model
    client = clients[0]
    assert torch.equal(models[client][~top], received[~top])
    weights = alg.weights[client]
    hand = alg.local[client] + (received[top] - alg.local[client]) * weights
    assert torch.allclose(models[client][top], hand, rtol=0, atol=1e-6) and not torch.equal(models[client], received)
    alg.weights.write([client], torch.ones(1, int(top.sum())))
    assert torch.equal(models[client], received)
    alg.weights.write([client], torch.zeros(1, int(top.sum())))
    assert torch.equal(models[client][top], alg.local[client]) and torch.equal(models[client][~top], received[~top])
    alg.weights.write([client], weights[None])


@pytest.mark.parametrize(
    "learned, limit, expected", [(False, 100, [6.0, 4.0]), (False, 5, [5.0, 4.0]), (True, 100, [1.0, 1.0])]
)
def test_a_clients_first_w_learning_stops_when_its_last_pass_losses_settle(monkeypatch, learned, limit, expected):
    fed = linear_federation(
        FedALA(num_pre_loss=3, threshold=0.1, max_start_passes=limit),
        num_clients=3,
        batch_size=4096,
        partition=QuantitySkew(min_size=30),
    )
    alg, server = fed.algorithm, fed.server
    clients = [0, 1]
    sizes = [int(0.8 * int(server.clients.train_sizes[c])) for c in clients]
    assert sizes[0] != sizes[1]  # one batch a client and pass, told apart by its size
    # client 0: std of passes 4-6 = std(0.6, 0.5, 0.5) = 0.047 < 0.1, of passes 3-5 = std(1, 0.6, 0.5) = 0.216: 6
    # client 1: std of passes 2-4 = 0 < 0.1, and 4 > 3 passes: 4
    script = {sizes[0]: [4.0, 2.0, 1.0, 0.6, 0.5, 0.5, 0.5, 0.5], sizes[1]: [1.0] * 8}
    calls = {size: 0 for size in sizes}

    def scripted(params, batch, step=0):
        size = batch[1].shape[1]
        calls[size] += 1
        return torch.full((len(params),), script[size][calls[size] - 1]), torch.zeros_like(params)

    monkeypatch.setattr(server.model, "group_loss_and_grad", scripted)
    starts = server.model.initial_params.expand(2, -1)
    _, passes = alg.learn_weights(
        1, clients, starts, starts + 1, torch.ones(2, server.model.num_params), torch.tensor([learned, learned])
    )
    assert passes.tolist() == expected and [calls[s] for s in sizes] == expected


def test_the_sample_is_s_percent_of_each_clients_own_training_rows():
    fed = small_federation(FedALA(rand_percent=30), num_clients=4)
    alg = fed.algorithm
    batches = alg.sample_batches(1, [0, 1, 2, 3])
    for row, client in enumerate([0, 1, 2, 3]):
        x, _ = client_data(fed, client)
        taken = torch.cat([batch[0][rows.index(row)] for rows, batch, _ in batches if row in rows])
        sample = int(0.3 * len(x))  # int(s / 100 * n), as PFLlib counts, in whole batches of 32 (its drop_last)
        assert sample > 32 and len(taken) == sample - sample % 32
        assert all(len(batch[1][0]) <= 32 for _, batch, _ in batches)  # at the federation's batch size
        pairs = (taken.flatten(1)[:, None] == x.flatten(1)[None]).all(dim=2)
        assert bool((pairs.sum(dim=1) >= 1).all()) and len(torch.unique(pairs.float().argmax(dim=1))) == len(taken)


@pytest.mark.parametrize(
    "arguments, option",
    [
        ({"layers": 0}, "layers"),
        ({"layers": 0.3}, "layers"),
        ({"rand_percent": 0}, "rand_percent"),
        ({"rand_percent": 100.5}, "rand_percent"),
        ({"eta": -1.0}, "eta"),
        ({"num_pre_loss": 0}, "num_pre_loss"),
    ],
)
def test_fedala_refuses_bad_input_in_one_line(arguments, option):
    with pytest.raises(ValueError, match=option) as error:
        FedALA(**arguments)
    assert "\n" not in str(error.value)


def test_fedala_refuses_more_layers_than_the_network_has():
    with pytest.raises(ValueError, match=r"layers must be at most the network's 3 layers") as error:
        small_federation(FedALA(layers=4), num_clients=2)
    assert "\n" not in str(error.value)
