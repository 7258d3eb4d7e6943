"""FedDBE: the running mean and the mean regularization worked by hand, one local epoch against PFLlib's client loop
written out here with plain torch (both trainers, three clients in one vectorized call), the global mean against
PFLlib's initialization pass by hand, the PRBM's exact shift of the features, an exact resume, and the refusals."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlight import Federation, FederationConfig
from fedlight.algorithms.feddbe import PRBM, RUNNING_MEAN, FedDBE, mean_regularization, updated_mean
from fedlight.datamodules import DigitsFederated, QuantitySkew
from fedlight.models import MLP, Classifier

from helpers.federations import ConvHead, every_row, mlp_federation
from helpers.newcomers import CountedNewcomers


def test_the_running_mean_and_the_mean_regularization_by_hand():
    """Previous (1, 1), batch features (0, 2) and (2, 4) (mean (1, 3)), momentum 1/4: 3/4 (1, 1) + 1/4 (1, 3) =
    (1, 1.5). Against the global mean (0, 0): (1/2 (1 + 2.25)) / 2 = 0.8125."""
    running = updated_mean(torch.ones(2), torch.tensor([[0.0, 2.0], [2.0, 4.0]]), 0.25)
    assert torch.equal(running, torch.tensor([1.0, 1.5]))
    assert math.isclose(float(mean_regularization(running, torch.zeros(2))), 0.8125)
    assert float(mean_regularization(torch.tensor([3.0, -1.0]), torch.tensor([3.0, -1.0]))) == 0.0


def hand_network(fed: Federation, start: torch.Tensor) -> tuple[MLP, nn.Parameter]:
    """The MLP and the PRBM vector of the flat model `start`, as plain torch tensors of their own."""
    fed.flat.load(start)
    network = MLP(64, [32], 10)
    network.load_state_dict(fed.module.network.state_dict())
    return network, nn.Parameter(fed.module.get_submodule(PRBM).bias.detach().clone())


def representation(network: MLP, x: torch.Tensor) -> torch.Tensor:
    return torch.relu(network.hidden[0](torch.flatten(x, 1)))


@pytest.mark.parametrize("vectorize", [0, 4], ids=["one by one", "vectorized"])
def test_one_local_epoch_is_pfllibs_client_loop(vectorize):
    """clientdbe.py's step, batch by batch in the engine's order: rep = the features; running mean = (1 - m) x the
    previous one (detached) + m x rep's batch mean; loss = CE(head(rep + PRBM)) + kappa x mean(1/2 (running mean -
    global mean)^2); one SGD step (the module's: lr 0.05, momentum 0.9) of the network and the PRBM. Three clients with
    their own nonzero PRBMs train in one call, so the vectorized trainer keeps a running mean per client."""
    fed = mlp_federation(FedDBE(kappa=2.0, momentum=0.3), vectorize=vectorize)
    alg, server = fed.algorithm, fed.server
    alg.global_mean = torch.linspace(0.0, 1.0, 32)
    clients = [0, 1, 2]
    starts = torch.stack([alg.client_model(c) for c in clients])
    starts[:, alg.prbm] = 0.1 * torch.randn(3, 32, generator=torch.Generator().manual_seed(1))
    trained = server.clients.train_many(1, clients, starts, epochs=1, objective=alg._objective).params
    for row, client in enumerate(clients):
        network, bias = hand_network(fed, starts[row])
        step = torch.optim.SGD([*network.parameters(), bias], lr=0.05, momentum=0.9)
        running = torch.zeros(32)
        for _, _, (x, y) in server.clients.batches(1, client, epochs=1):
            rep = representation(network, x)
            current = (1 - 0.3) * running + 0.3 * rep.mean(dim=0)
            loss = F.cross_entropy(network.out(rep + bias), y) + 2.0 * (0.5 * (current - alg.global_mean) ** 2).mean()
            step.zero_grad()
            loss.backward()
            step.step()
            running = current.detach()
        fed.flat.load(trained[row])
        for mine, theirs in zip(
            [*fed.module.network.parameters(), fed.module.get_submodule(PRBM).bias], [*network.parameters(), bias]
        ):
            assert torch.allclose(mine, theirs, atol=1e-5)
        assert torch.allclose(fed.module.get_submodule(RUNNING_MEAN).mean, running, atol=1e-5)


def test_the_global_mean_is_pfllibs_initialization_pass():
    """serverdbe.py before round 1: every client trains the initial model for the local epochs (2) on cross-entropy
    alone, tracking its running mean (momentum 0.5), and the global mean is the training-set-size weighted mean of
    the final running means."""
    fed = mlp_federation(FedDBE(momentum=0.5), vectorize=0)
    alg, server = fed.algorithm, fed.server
    alg.begin_round(1)
    total = torch.zeros(32)
    for client in range(server.num_clients):
        network, _ = hand_network(fed, server.model.initial_params)
        step = torch.optim.SGD(network.parameters(), lr=0.05, momentum=0.9)
        running = torch.zeros(32)
        for _, _, (x, y) in server.clients.batches(0, client, epochs=2):
            rep = representation(network, x)
            running = 0.5 * running + 0.5 * rep.mean(dim=0).detach()
            step.zero_grad()
            F.cross_entropy(network.out(rep), y).backward()
            step.step()
        total += float(server.clients.train_sizes[client]) * running
    assert torch.allclose(alg.global_mean, total / server.clients.train_sizes.sum(), atol=1e-5)


def test_the_prbm_shifts_the_features_exactly_and_is_personal():
    """prediction = head(features + the client's vector), the features unshifted; the vector is the personal part,
    and a newcomer gets the averaged model with a zero vector."""
    fed = mlp_federation(FedDBE(), vectorize=0)
    alg, server = fed.algorithm, fed.server
    assert torch.equal(alg.personal_mask, server.model.layer_mask([PRBM])) and int(alg.personal_mask.sum()) == 32
    params, x = alg.client_model(2).clone(), fed.data.test.client(2)[0]
    vector = torch.linspace(-1.0, 2.0, 32)
    params[alg.prbm] = vector
    network, _ = hand_network(fed, params)
    with torch.no_grad():
        rep = representation(network, x)
        by_hand = F.linear(rep + vector, network.out.weight, network.out.bias)
    features, outputs = server.model.features(params, x)
    assert torch.allclose(outputs, by_hand, atol=1e-5) and torch.allclose(features, rep, atol=1e-5)
    assert torch.allclose(server.model.predict(params, x), by_hand, atol=1e-5)
    models, _, _ = alg.newcomer_models(CountedNewcomers(3))
    assert not models[0][alg.prbm].any()


def test_a_resumed_run_repeats_round_two_exactly():
    a = mlp_federation(FedDBE(participation=0.4), vectorize=0)  # 2 of the 5 clients a round
    a.run_round(1)
    assert not a.algorithm.models[:, a.algorithm.running_mean].any()  # the clients sent no running mean
    b = mlp_federation(FedDBE(participation=0.4), vectorize=0)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    assert torch.equal(b.algorithm.global_mean, a.algorithm.global_mean)  # kept, not computed again
    ra, rb = a.run_round(2), b.run_round(2)
    for key, value in a.algorithm.state_dict().items():
        other = b.algorithm.state_dict()[key]
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, key
    for name, store in a.client_states.stores.items():
        assert torch.equal(every_row(store), every_row(b.client_states.stores[name])), name
    assert ra.scalars["test/acc_mean"] == rb.scalars["test/acc_mean"]
    trained = sorted(set(a.algorithm.select_clients(1)) | set(a.algorithm.select_clients(2)))
    vectors = torch.stack([a.algorithm.client_model(c)[a.algorithm.prbm] for c in trained])
    assert len(trained) >= 2 and vectors.any(dim=1).all() and not torch.equal(vectors[0], vectors[1])  # each its own


def test_bad_settings_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"kappa .* must be >= 0, got -1.0: set algorithm.init_args.kappa"):
        FedDBE(kappa=-1.0)
    with pytest.raises(ValueError, match=r"momentum .* must be in \[0, 1\], got 1.5: set algorithm.init_args.momentum"):
        FedDBE(momentum=1.5)
    with pytest.raises(ValueError, match="FedDBE reads the features at the network's head, which must be a linear"):
        mlp_federation(FedDBE(), network=ConvHead())
    cohort = FederationConfig(rounds=1, clients_per_round=2, accelerator="cpu", vectorize=0)
    data = DigitsFederated(num_clients=4, partition=QuantitySkew(alpha=0.5, min_size=20))
    with pytest.raises(
        ValueError,
        match=r"FedDBE trains every client once before round 1 .* or set "
        r"algorithm.init_args.every_client_mean: false",
    ):
        Federation(data, Classifier(MLP(64, [32], 10)), FedDBE(), cohort)
    without_mr = Federation(data, Classifier(MLP(64, [32], 10)), FedDBE(kappa=0.0), cohort)  # no global mean to compute
    without_mr.algorithm.begin_round(1)
    assert without_mr.algorithm.global_mean is None
