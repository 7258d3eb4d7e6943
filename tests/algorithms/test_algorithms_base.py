"""FedAvg, FedProx and Local against computations done by hand or by retraining clients alone."""

import torch

from fedlight import RoundUpdates
from fedlight.plugin.algorithm import Algorithm, Updates
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedprox import FedProx
from fedlight.algorithms.local import Local

from helpers.federations import small_federation


def test_fedavg_aggregate_is_the_size_weighted_mean():
    fed = small_federation(FedAvg(), num_clients=3)
    d = fed.flat.numel
    params = torch.stack([torch.full((d,), 1.0), torch.full((d,), 2.0), torch.full((d,), 4.0)])
    sizes = torch.tensor([1, 1, 2])
    updates = Updates(torch.tensor([0, 1, 2]), params, params.clone(), sizes, torch.zeros(3))
    fed.algorithm.aggregate(1, RoundUpdates.of(updates))
    assert torch.allclose(fed.algorithm.models[0], torch.full((d,), (1 * 1 + 1 * 2 + 2 * 4) / 4))


def test_fedavg_round_matches_a_hand_weighted_mean_of_real_updates():
    fed = small_federation(FedAvg(), num_clients=4)
    updates = fed.execution.train(1, [0, 1, 2, 3])
    n = fed.data.train.sizes().astype("float64")
    expected = sum(n[k] * updates.params[k].double() for k in range(4)) / n.sum()
    fed.algorithm.aggregate(1, RoundUpdates.of(updates))
    assert torch.allclose(fed.algorithm.models[0].double(), expected, atol=1e-6)


def test_partial_participation_selects_the_same_clients_for_the_same_round():
    alg = FedAvg(participation=0.5)
    small_federation(alg, num_clients=8)
    picks = [alg.select_clients(r) for r in (1, 2, 1)]
    assert len(picks[0]) == 4 and picks[0] == picks[2] and len(set(picks[0])) == 4


def test_fedprox_with_mu_zero_equals_fedavg():
    a = small_federation(FedAvg(), rounds=2)
    b = small_federation(FedProx(mu=0.0), rounds=2)
    for r in (1, 2):
        a.run_round(r), b.run_round(r)
    assert torch.equal(a.algorithm.models, b.algorithm.models)


def test_fedprox_gradient_is_the_gradient_of_the_proximal_term():
    mu = 0.3
    w = torch.randn(10, requires_grad=True)
    start = torch.randn(10)
    (0.5 * mu * (w - start).pow(2).sum()).backward()
    grad = torch.zeros(10)
    FedProx(mu=mu).local_gradient(0, w.detach(), grad, start)
    assert torch.allclose(grad, w.grad)


def test_fedprox_keeps_clients_closer_to_their_start():
    plain = small_federation(FedAvg())
    prox = small_federation(FedProx(mu=5.0))
    drift = [(f.execution.train(1, [0]).deltas.norm()) for f in (plain, prox)]
    assert drift[1] < drift[0]


def test_local_never_averages_each_model_is_its_client_trained_alone():
    fed = small_federation(Local(), num_clients=3, rounds=2)
    for r in (1, 2):
        fed.run_round(r)
    for k in range(3):
        alone = fed.server.model.initial_params
        x, y = fed.data.train.client(k)
        for r in (1, 2):
            alone = fed.execution.trainer.fit(alone, x, y, fed.server.random.client_seed(r, k)).params
        assert torch.equal(fed.algorithm.client_model(k), alone)
    assert not torch.equal(fed.algorithm.client_model(0), fed.algorithm.client_model(1))


class LastLayerPersonal(Algorithm):
    def setup(self, server):
        super().setup(server)
        self.set_personal_mask(server.model.layer_mask(server.model.layers()[-1:]))


def test_personal_layers_are_untouched_by_aggregation():
    fed = small_federation(LastLayerPersonal(), num_clients=3)
    alg = fed.algorithm
    initial_personal = fed.server.model.initial_params[alg.personal_mask]
    updates = fed.execution.train(1, [0, 1, 2])
    alg.aggregate(1, RoundUpdates.of(updates))
    assert torch.equal(alg.models[0][alg.personal_mask], initial_personal)  # the server never averages them
    for i, k in enumerate([0, 1, 2]):
        model = alg.client_model(k)
        assert torch.equal(model[alg.personal_mask], updates.params[i][alg.personal_mask])
        assert torch.equal(model[~alg.personal_mask], alg.models[0][~alg.personal_mask])
