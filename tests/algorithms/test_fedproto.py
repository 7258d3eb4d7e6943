"""FedProto: the local objective, the prototypes a client sends, their average on the server and nearest-prototype
prediction, each against a small case worked by hand; one local epoch against plain torch SGD on the same loss; a
resumed run against an uninterrupted one; bad input refused in one line."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlight.algorithms.fedproto import (
    FedProto,
    global_prototypes,
    local_prototypes,
    nearest_prototype_logits,
    prototype_distance,
)
from fedlight.models import MLP

from helpers.federations import ConvHead, every_row, mlp_federation, small_federation


def test_the_objective_is_cross_entropy_plus_lambda_times_the_mean_squared_distance_to_the_class_prototypes():
    """Features (1, 2), (3, 0), (0, 1) of classes 0, 1, 1; prototypes (0, 0) and (1, 1). Squared differences: (1, 4),
    (4, 1), (1, 0), summing to 11 over 3 x 2 entries: 11 / 6. Without class 1's prototype only the first sample's 5
    is left, still over 6 entries. A zero head gives logits 0: cross-entropy log 2."""
    features, y = torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1, 1])
    prototypes = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    both, first = torch.tensor([True, True]), torch.tensor([True, False])
    assert math.isclose(float(prototype_distance(features, y, prototypes, both)), 11 / 6, rel_tol=1e-6)
    assert math.isclose(float(prototype_distance(features, y, prototypes, first)), 5 / 6, rel_tol=1e-6)
    algorithm, head = FedProto(lam=0.5), nn.Linear(2, 2)
    nn.init.zeros_(head.weight), nn.init.zeros_(head.bias)
    algorithm.server, algorithm.prototypes, algorithm.known = (
        SimpleNamespace(model=SimpleNamespace(head=head)),
        prototypes,
        both,
    )
    with torch.no_grad():
        loss = algorithm._objective(nn.Sequential(head), (features, y), torch.empty(0))
    assert math.isclose(float(loss), math.log(2) + 0.5 * 11 / 6, rel_tol=1e-6)


def test_a_clients_prototypes_are_its_mean_features_per_class():
    features, y = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]]), torch.tensor([0, 0, 1])
    prototypes, counts = local_prototypes(features, y, classes=3)
    assert torch.equal(prototypes, torch.tensor([[2.0, 1.0], [5.0, 5.0], [0.0, 0.0]]))
    assert counts.tolist() == [2, 1, 0]


def test_the_global_prototype_is_the_unweighted_mean_over_the_clients_holding_the_class():
    """Client A: class 0 (1, 1) from 3 samples, class 1 (2, 0) from 1; client B: class 0 (3, 5) from 4, no class 1.
    Class 0: ((1, 1) + (3, 5)) / 2 = (2, 3), not the size-weighted (15, 23) / 7; class 1: A's alone; class 2, held by
    neither, keeps its previous prototype (9, 9), and class 3 stays without one."""
    prototypes = torch.tensor(
        [[[1.0, 1.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[3.0, 5.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]]
    )
    counts = torch.tensor([[3, 1, 0, 0], [4, 0, 0, 0]])
    previous = torch.tensor([[7.0, 7.0], [8.0, 8.0], [9.0, 9.0], [0.0, 0.0]])
    merged, known = global_prototypes(prototypes, counts, previous, torch.tensor([True, True, True, False]))
    assert torch.equal(merged, torch.tensor([[2.0, 3.0], [2.0, 0.0], [9.0, 9.0], [0.0, 0.0]]))
    assert known.tolist() == [True, True, True, False]


def test_prediction_is_the_nearest_known_prototype():
    """Prototypes (0, 0), (4, 0), (0, 3), the last not known. (1, 0): distances 1 and 3, class 0. (3, 1): sqrt 10
    and sqrt 2, class 1. (0, 2.9): 2.9 and sqrt(16 + 8.41); the unknown class 2 at 0.1 is never predicted: class 0."""
    features = torch.tensor([[1.0, 0.0], [3.0, 1.0], [0.0, 2.9]])
    logits = nearest_prototype_logits(
        features, torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 3.0]]), torch.tensor([True, True, False])
    )
    assert torch.allclose(
        logits[:, :2],
        -torch.tensor([[1.0, 3.0], [math.sqrt(10), math.sqrt(2)], [2.9, math.sqrt(16 + 2.9**2)]]),
        atol=1e-5,
    )
    assert bool((logits[:, 2] == float("-inf")).all()) and logits.argmax(dim=1).tolist() == [0, 1, 0]


@pytest.mark.parametrize("vectorize", [0, 4], ids=["one by one", "vectorized"])
def test_one_local_epoch_is_sgd_on_cross_entropy_plus_the_prototype_distance(vectorize):
    """Written with plain torch: per batch, cross-entropy of the MLP + 0.5 x the mean of (hidden features - global
    prototype of the label)^2 masked to the known classes, one SGD step (momentum 0.9, as the module's)."""
    fed = mlp_federation(FedProto(lam=0.5), vectorize=vectorize)
    alg = fed.algorithm
    alg.prototypes = torch.randn(10, 32, generator=torch.Generator().manual_seed(1))
    alg.known = torch.arange(10) % 3 != 0  # classes 0, 3, 6, 9 without a prototype
    client, start = 1, alg.client_model(1)
    trained = fed.server.clients.train_many(1, [client], start[None], epochs=1, objective=alg._objective).params[0]
    network = MLP(64, [32], 10)
    fed.flat.load(start)
    network.load_state_dict(fed.module.network.state_dict())
    step = torch.optim.SGD(network.parameters(), lr=0.05, momentum=0.9)
    for _, _, (x, y) in fed.server.clients.batches(1, client, epochs=1):
        features = torch.relu(network.hidden[0](torch.flatten(x, 1)))
        mask = alg.known[y].float()[:, None]
        loss = F.cross_entropy(network.out(features), y) + 0.5 * ((features - alg.prototypes[y]) ** 2 * mask).mean()
        step.zero_grad()
        loss.backward()
        step.step()
    fed.flat.load(trained)
    for mine, theirs in zip(fed.module.network.parameters(), network.parameters()):
        assert torch.allclose(mine, theirs, atol=1e-5)


def test_a_round_averages_the_clients_prototypes_and_evaluates_by_the_nearest_one():
    """After one round every client's model is its own, the global prototype of each class is the mean of the
    clients' mean hidden features of it (computed here from each trained MLP), and a client's outputs are minus the
    distances of its features to them."""
    fed = mlp_federation(FedProto(), vectorize=0)
    fed.run_round(1)
    alg, split = fed.algorithm, fed.data.train
    assert not torch.equal(alg.client_model(0), alg.client_model(1))
    by_client = []
    for c in range(5):
        fed.flat.load(alg.client_model(c))
        x, y = split.client(c)
        with torch.no_grad():
            features = torch.relu(fed.module.network.hidden[0](torch.flatten(x, 1)))
        by_client.append({k: features[y == k].mean(dim=0) for k in y.unique().tolist()})
    for k in range(10):
        held = [protos[k] for protos in by_client if k in protos]
        assert torch.allclose(alg.prototypes[k], torch.stack(held).mean(dim=0), atol=1e-5)
    x = fed.data.test.client(2)[0]
    fed.flat.load(alg.client_model(2))
    with torch.no_grad():
        features = torch.relu(fed.module.network.hidden[0](torch.flatten(x, 1)))
    distances = ((features[:, None, :] - alg.prototypes[None]) ** 2).sum(dim=2).sqrt()
    assert torch.allclose(fed.server.model.predict(alg.client_model(2), x), -distances, atol=1e-4)


def test_a_resumed_run_ends_as_an_uninterrupted_one():
    """Round 2 after restoring round 1's state (half the clients a round) equals round 2 of an uninterrupted run: the
    clients' models, the prototypes and the evaluation."""

    def make():
        return small_federation(FedProto(participation=0.5), num_clients=4, rounds=2)

    a = make()
    a.run_round(1)
    state = a.state_dict()
    state["algorithm"] = {k: v.clone() if torch.is_tensor(v) else v for k, v in state["algorithm"].items()}
    b = make()
    b.load_state_dict(state)
    ra, rb = a.run_round(2), b.run_round(2)
    for name in ("local_models", "prototypes", "known"):
        assert torch.equal(every_row(getattr(a.algorithm, name)), every_row(getattr(b.algorithm, name))), name
    assert ra.evaluation == rb.evaluation and bool(a.algorithm.known.all())


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(ValueError, match="lam must be >= 0"):
        FedProto(lam=-0.1)
    with pytest.raises(ValueError, match="FedProto reads the features at the network's head, which must be a linear"):
        mlp_federation(FedProto(), network=ConvHead())
