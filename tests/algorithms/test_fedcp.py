"""FedCP: the MMD and the conditional policy worked by hand, one local epoch against the authors' step written out
here with plain torch (Gumbel draws included), vectorized against one by one, prediction by the two heads, the
server's average of the uploaded global heads, an exact resume, newcomers, and the refusal of bad input."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedlight.algorithms.fedcp as fedcp
from fedlight.algorithms.fedcp import GLOBAL_HEAD, POLICY, FedCP, context_of, mmd, policy_shares
from fedlight.models import MLP
from fedlight.plugin import ModelParts

from helpers.federations import ConvHead, every_row, mlp_federation, noisy_starts
from helpers.newcomers import CountedNewcomers


def kernel(squared_distance: float) -> float:
    return sum(math.exp(-squared_distance / (2 * a)) for a in (10, 15, 20, 50))


def test_mmd_is_the_biased_estimate_under_four_gaussian_kernels():
    """x = (0, 2), y = (1, 1) on a line (float64: the terms nearly cancel): the pairs within x are 0 and 2 apart, within
    y 0, across 1; over the four pairs of each kind, MMD = (2 k(0) + 2 k(4) + 4 k(0) - 2 * 4 k(1)) / 4."""
    x, y = torch.tensor([[0.0], [2.0]], dtype=torch.float64), torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    by_hand = (6 * kernel(0) + 2 * kernel(4) - 8 * kernel(1)) / 4
    assert math.isclose(float(mmd(x, y)), by_hand, rel_tol=1e-6)
    assert float(mmd(x, x)) == 0


def test_the_policy_splits_each_feature_by_the_softmax_of_its_pair_of_scores():
    """Personal head rows (1, 1) and (2, 3): context (3, 4) / 5. Features (1, 1) times it: (0.6, 0.8). The CPN's
    linear layer reads the first: (0.6, -0.6, -0.6, 0.6); LayerNorm (mean 0, variance 0.36) and ReLU give
    (z, 0, 0, z), z = 0.6 / sqrt(0.36 + 1e-5); the pairs (personal, global) are (z, 0) and (0, z)."""
    context = context_of(torch.tensor([[1.0, 1.0], [2.0, 3.0]]))
    assert torch.allclose(context, torch.tensor([0.6, 0.8]))
    policy = fedcp.policy_network(2)
    with torch.no_grad():
        policy[0].weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0], [1.0, 0.0]]))
        policy[0].bias.zero_()
    personal, shared = policy_shares(policy, torch.ones(1, 2), context, noisy=False)
    z = 0.6 / math.sqrt(0.36 + 1e-5)
    sigmoid = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731  (the softmax of a pair)
    assert torch.allclose(personal, torch.tensor([[sigmoid(z), sigmoid(-z)]]))
    assert torch.allclose(shared, torch.tensor([[sigmoid(-z), sigmoid(z)]]))


def authors_mmd(x, y):
    """PFLlib's MMD(x, y, 'rbf'), its squared distances from torch.cdist here."""
    k = lambda d2: sum(torch.exp(-0.5 * d2 / a) for a in (10, 15, 20, 50))  # noqa: E731
    return (k(torch.cdist(x, x) ** 2) + k(torch.cdist(y, y) ** 2) - 2 * k(torch.cdist(x, y) ** 2)).mean()


def test_local_training_is_the_authors_step():
    """PFLlib's clientcp.py for one client, written with plain torch: per batch, features of the trained body, the
    context (its personal head's rows summed, normalized) times them into the CPN, Gumbel-softmax shares (drawn from
    the generator the engine seeds), personal head on h * r plus the frozen global head on h * s, cross-entropy +
    lam MMD against the frozen global body, one optimizer (the module's: SGD, momentum 0.9) over body, personal head
    and CPN, for the federation's 2 local epochs; then the upload's global head is the mean of the personal and
    received global heads."""
    fed = mlp_federation(FedCP(lam=5.0), vectorize=0, batch_size=64)
    client, start = 1, noisy_starts(fed, 1)[0]
    trained = fed.algorithm.train_group(1, [client], start[None]).params[0]
    network, base, policy, head_g = MLP(64, [32], 10), MLP(64, [32], 10), fedcp.policy_network(32), nn.Linear(32, 10)
    fed.flat.load(fed.algorithm.models[0])  # the round's global model: the frozen body
    base.load_state_dict(fed.module.network.state_dict())
    fed.flat.load(start)
    network.load_state_dict(fed.module.network.state_dict())
    policy.load_state_dict(fed.module.get_submodule(POLICY).state_dict())
    head_g.load_state_dict(fed.module.get_submodule(GLOBAL_HEAD).state_dict())
    base.requires_grad_(False), head_g.requires_grad_(False)
    context = F.normalize(network.out.weight.detach().sum(0, keepdim=True), dim=1)
    step = torch.optim.SGD([*network.parameters(), *policy.parameters()], lr=0.05, momentum=0.9)
    for _, _, (x, y) in fed.server.clients.batches(1, client):
        rep = torch.relu(network.hidden[0](torch.flatten(x, 1)))
        shares = F.gumbel_softmax(policy(rep * context).view(len(x), 2, -1), dim=1, tau=1, hard=False)
        output = network.out(rep * shares[:, 0]) + head_g(rep * shares[:, 1])
        rep_base = torch.relu(base.hidden[0](torch.flatten(x, 1)))
        loss = F.cross_entropy(output, y) + 5.0 * authors_mmd(rep, rep_base)
        step.zero_grad()
        loss.backward()
        step.step()
    upload = [0.5 * p + 0.5 * g for p, g in zip(network.out.parameters(), head_g.parameters())]
    fed.flat.load(trained)
    mine = [
        *fed.module.network.parameters(),
        *fed.module.get_submodule(GLOBAL_HEAD).parameters(),
        *fed.module.get_submodule(POLICY).parameters(),
    ]
    for got, expected in zip(mine, [*network.parameters(), *upload, *policy.parameters()], strict=True):
        assert torch.allclose(got, expected, atol=1e-5)


def test_vectorized_training_is_one_by_one(monkeypatch):
    """Without the Gumbel draws (random layers draw other numbers vectorized), the two trainers agree."""
    monkeypatch.setattr(fedcp, "gumbel_noise", torch.zeros_like)
    clients = [0, 2, 4]
    trained = []
    for vectorize in (0, 3):
        fed = mlp_federation(FedCP(lam=2.0), vectorize=vectorize, batch_size=64)
        trained.append(fed.algorithm.train_group(1, clients, noisy_starts(fed, len(clients))).params)
    assert torch.allclose(*trained, atol=1e-5)


def test_a_round_averages_body_policy_and_uploaded_global_heads_clients_predict_with_both_heads_and_it_resumes():
    """Round 1 of 3 clients of 5: the global head becomes 0.5 x the one received + 0.5 x the clients' size-weighted
    mean of their trained personal heads; a client's prediction, worked out with plain torch; a newcomer's personal
    head; then round 2 after a resume from round 1's state equals round 2 of the run itself."""
    fed = mlp_federation(FedCP(participation=0.6), vectorize=0, batch_size=64)
    alg, server = fed.algorithm, fed.server
    personal, shared = server.model.layer_mask(["network.out"]), server.model.layer_mask([GLOBAL_HEAD])
    assert torch.equal(alg.personal_mask, personal) and torch.equal(alg.models[0, shared], alg.models[0, personal])
    assert int(server.model.layer_mask([f"{POLICY}.0", f"{POLICY}.1"]).sum()) == (
        32 * 64
        + 64  # Linear,
        + 2 * 64
    )  # LayerNorm
    received, clients = alg.models[0, shared].clone(), alg.select_clients(1)
    assert len(clients) == 3
    fed.run_round(1)
    weights = server.clients.train_sizes[clients].float() / server.clients.train_sizes[clients].sum()
    heads = torch.stack([alg.client_model(c)[personal] for c in clients])
    assert torch.allclose(alg.models[0, shared], 0.5 * received + 0.5 * weights @ heads, atol=1e-6)
    assert not torch.equal(heads[0], heads[1])  # each its own
    assert torch.equal(alg.client_model(0)[~personal], alg.client_model(1)[~personal])  # one shared model

    params, x = alg.client_model(clients[0]), fed.data.test.client(clients[0])[0]
    fed.flat.load(params)
    net, policy, head_g = fed.module.network, fed.module.get_submodule(POLICY), fed.module.get_submodule(GLOBAL_HEAD)
    with torch.no_grad():
        rep = torch.relu(net.hidden[0](torch.flatten(x, 1)))
        context = F.normalize(net.out.weight.sum(0), dim=0)
        pair = policy(rep * context).view(len(x), 2, 32).softmax(dim=1)  # evaluation: no Gumbel noise
        by_hand = F.linear(rep * pair[:, 0], net.out.weight, net.out.bias) + head_g(rep * pair[:, 1])
    assert torch.allclose(server.model.predict(params, x), by_hand, atol=1e-5)
    models, which, clusters = alg.newcomer_models(CountedNewcomers(3))
    assert clusters is None and which.tolist() == [0, 0, 0]
    assert torch.equal(models[0, personal], alg.models[0, shared])  # a newcomer's personal head is the global head

    resumed = mlp_federation(FedCP(participation=0.6), vectorize=0, batch_size=64)
    resumed.load_state_dict(copy.deepcopy(fed.state_dict()))
    ra, rb = fed.run_round(2), resumed.run_round(2)
    assert torch.equal(alg.models, resumed.algorithm.models)
    for name, store in fed.client_states.stores.items():
        assert torch.equal(every_row(store), every_row(resumed.client_states.stores[name])), name
    assert ra.scalars["test/acc_mean"] == rb.scalars["test/acc_mean"]


def test_bad_input_is_refused_in_one_line():
    with pytest.raises(ValueError, match="lam .* must be >= 0, got -1"):
        FedCP(lam=-1.0)
    with pytest.raises(ValueError, match="at least one feature"):
        FedCP().extend_model(ModelParts(nn.Sequential(nn.Linear(3, 0), nn.Linear(0, 10)), "1", 10))
    with pytest.raises(ValueError, match="FedCP reads the features at the network's head, which must be a linear"):
        mlp_federation(FedCP(), network=ConvHead())
