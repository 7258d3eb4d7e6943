"""FedRoD: the balanced softmax worked by hand, one local epoch against the authors' two-optimizer step written out
here with plain torch, the personal head's start, mask and prediction by the sum of both heads, the generic model for
newcomers, and the refusal of a head that is not linear."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlight.algorithms.fedrod import PERSONAL_HEAD, FedRoD, balanced_softmax_loss
from fedlight.models import MLP

from helpers.federations import ConvHead, mlp_federation
from helpers.newcomers import CountedNewcomers


def test_balanced_softmax_shifts_the_logits_by_the_log_class_counts():
    """Logits (0, 0), counts (3, 1): softmax of (log 3, 0) gives class 0 the probability 3/4, so the loss of label 0
    is log(4/3) and of label 1 log 4; a class with no sample (count 0) drops out of the softmax."""
    logits = torch.zeros(2, 2)
    loss = balanced_softmax_loss(logits, torch.tensor([0, 1]), torch.tensor([3.0, 1.0]).log())
    assert math.isclose(float(loss), (math.log(4 / 3) + math.log(4)) / 2, rel_tol=1e-6)
    three = balanced_softmax_loss(
        torch.tensor([[1.0, 2.0, 5.0]]), torch.tensor([0]), torch.tensor([1.0, 1.0, 0.0]).log()
    )
    assert math.isclose(float(three), math.log(1 + math.e), rel_tol=1e-6)  # -log(e / (e + e^2))


@pytest.mark.parametrize("vectorize", [0, 4], ids=["one by one", "vectorized"])
def test_one_local_epoch_is_the_authors_two_optimizer_step(vectorize):
    """PFLlib's clientrod.py: per batch, an SGD step of body + generic head on the balanced softmax, then an SGD step
    of the personal head on cross-entropy of (generic logits detached + personal logits of the detached features).
    Written here with two torch optimizers (momentum 0.9, as the module's), batch by batch in the engine's order."""
    fed = mlp_federation(FedRoD(), vectorize=vectorize)
    client, start = 1, fed.algorithm.client_model(1)
    trained = fed.server.clients.train_many(
        1,
        [client],
        start[None],
        epochs=1,
        objective=fed.algorithm._objective,
        client_inputs=torch.bincount(fed.data.train.client(client)[1], minlength=10).float().log()[None],
    ).params[0]
    network = MLP(64, [32], 10)
    personal = nn.Linear(32, 10)
    fed.flat.load(start)
    network.load_state_dict(fed.module.network.state_dict())
    personal.load_state_dict(fed.module.get_submodule(PERSONAL_HEAD).state_dict())
    shared_step = torch.optim.SGD(network.parameters(), lr=0.05, momentum=0.9)
    personal_step = torch.optim.SGD(personal.parameters(), lr=0.05, momentum=0.9)
    counts = torch.bincount(fed.data.train.client(client)[1], minlength=10).float()
    for _, _, (x, y) in fed.server.clients.batches(1, client, epochs=1):
        rep = torch.relu(network.hidden[0](torch.flatten(x, 1)))
        generic = network.out(rep)
        loss = F.cross_entropy(generic + counts.log(), y)
        shared_step.zero_grad()
        loss.backward()
        shared_step.step()
        loss = F.cross_entropy(generic.detach() + personal(rep.detach()), y)
        personal_step.zero_grad()
        loss.backward()
        personal_step.step()
    fed.flat.load(trained)
    for mine, theirs in zip(fed.module.parameters(), [*network.parameters(), *personal.parameters()]):
        assert torch.allclose(mine, theirs, atol=1e-5)


def test_the_personal_head_starts_as_the_generic_head_and_is_personal():
    fed = mlp_federation(FedRoD())
    alg, server = fed.algorithm, fed.server
    head, personal = server.model.layer_mask(["network.out"]), server.model.layer_mask([PERSONAL_HEAD])
    assert int(personal.sum()) == 32 * 10 + 10 and torch.equal(alg.personal_mask, personal)
    assert torch.equal(alg.client_model(3)[personal], alg.client_model(3)[head])
    fed.run_round(1)
    assert not torch.equal(alg.client_model(0)[personal], alg.client_model(1)[personal])  # each its own
    assert torch.equal(alg.client_model(0)[~personal], alg.client_model(1)[~personal])  # one shared model


def test_a_client_predicts_with_the_sum_of_both_heads_and_a_newcomer_with_the_generic_model():
    fed = mlp_federation(FedRoD())
    fed.run_round(1)
    params, x = fed.algorithm.client_model(2), fed.data.test.client(2)[0]
    fed.flat.load(params)
    net, personal = fed.module.network, fed.module.get_submodule(PERSONAL_HEAD)
    with torch.no_grad():
        rep = torch.relu(net.hidden[0](torch.flatten(x, 1)))
        generic = F.linear(rep, net.out.weight, net.out.bias)  # not net.out(rep): FedRoD's hook adds the personal head
        by_hand = generic + personal(rep)
    assert torch.allclose(fed.server.model.predict(params, x), by_hand, atol=1e-5)
    models, which, clusters = fed.algorithm.newcomer_models(CountedNewcomers(4))
    assert clusters is None and which.tolist() == [0, 0, 0, 0]
    assert torch.allclose(fed.server.model.predict(models[0], x), generic, atol=1e-5)


def test_a_head_that_is_not_linear_is_refused_in_one_line():
    with pytest.raises(ValueError, match="FedRoD reads the features at the network's head, which must be a linear"):
        mlp_federation(FedRoD(), network=ConvHead())
