"""FedAMP against independent computations: the message-passing weights and cloud models of three 2-entry models
worked by hand, the client's proximal step as two plain gradient steps, and a 2-round run whose cloud models are
recomputed from the stored personal models in float64."""

import math

import pytest
import torch

from fedlight.algorithms.fedamp import FedAMP, attention_weights, cloud_models, squared_distances

from helpers.federations import small_federation


def test_weights_and_cloud_models_of_three_two_entry_models_by_hand():
    """w1 = (0, 0), w2 = (1, 0), w3 = (0, 2): squared distances 1, 4, 5. With alpha_k = 0.5 and sigma = 2,
    xi_ij = 0.5 exp(-d / 2) / 2 = 0.25 exp(-d / 2): xi_12 = 0.25 e^-0.5, xi_13 = 0.25 e^-2, xi_23 = 0.25 e^-2.5."""
    w = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    x12, x13, x23 = 0.1516326649, 0.0338338208, 0.0205212497
    expected_xi = torch.tensor(
        [[1 - x12 - x13, x12, x13], [x12, 1 - x12 - x23, x23], [x13, x23, 1 - x13 - x23]], dtype=torch.float64
    )
    sq = squared_distances(w)
    assert torch.allclose(sq, torch.tensor([[0.0, 1, 4], [1, 0, 5], [4, 5, 0]], dtype=torch.float64), atol=1e-6)
    xi = attention_weights(sq, alpha_k=0.5, sigma=2.0)
    assert torch.allclose(xi, expected_xi, atol=1e-9)
    # u_1 = xi_12 w2 + xi_13 w3, u_2 = xi_22 w2 + xi_23 w3, u_3 = xi_32 w2 + xi_33 w3 (w1 = 0)
    expected_u = torch.tensor([[x12, 2 * x13], [1 - x12 - x23, 2 * x23], [x23, 2 * (1 - x13 - x23)]])
    assert torch.allclose(cloud_models(w, xi), expected_u, atol=1e-6)
    same = torch.tensor([[0.3, -1.7]]).repeat(3, 1)  # equal models (every round 1) are their own cloud models exactly
    assert torch.equal(cloud_models(same, attention_weights(squared_distances(same), 1.0, 0.5)), same)


def test_the_client_step_adds_lambda_over_alpha_k_times_w_minus_u_to_every_gradient():
    alpha_k, lam = 0.5, 0.8
    fed = small_federation(FedAMP(alpha_k=alpha_k, lam=lam), num_clients=3, local_epochs=2, batch_size=10_000)
    alg, server = fed.algorithm, fed.server
    u = server.model.initial_params + 0.05 * torch.randn(
        server.model.num_params, generator=torch.Generator().manual_seed(1)
    )
    trained = alg.train_group(1, [1], u[None]).params[0]
    (_, _, first), (_, _, second) = list(server.clients.batches(1, 1, 2))  # one batch an epoch: two SGD steps
    lr = server.clients.learning_rate(1)
    w1 = u - lr * server.model.loss_and_grad(u, first)[1]  # at u itself the pull is 0
    g1 = server.model.loss_and_grad(w1, second)[1]
    assert torch.allclose(trained, w1 - lr * (g1 + lam / alpha_k * (w1 - u)), atol=1e-6)
    assert (trained - (w1 - lr * g1)).norm() > 1e-3  # the pull is there, towards u
    assert (trained - u).norm() < (w1 - lr * g1 - u).norm()


def test_two_rounds_mix_the_round_clients_stored_models_and_evaluate_each_client_with_its_own():
    fed = small_federation(FedAMP(participation=0.75), num_clients=4)
    alg, server = fed.algorithm, fed.server
    first = alg.select_clients(1)
    fed.run_round(1)
    assert alg.cloud == {}  # spent with the round
    for k in range(4):
        assert torch.equal(alg.personal_models[k], server.model.initial_params) == (k not in first)

    clients = alg.select_clients(2)
    assert len(clients) == 3
    w = {c: alg.personal_models[c].double() for c in clients}
    sigma = 1.0 * (len(clients) - 1)  # the default: alpha_k (m - 1)
    expected = {}
    for i in clients:
        weight = {j: math.exp(-float((w[i] - w[j]).square().sum()) / sigma) / sigma for j in clients if j != i}
        expected[i] = (1 - sum(weight.values())) * w[i] + sum(x * w[j] for j, x in weight.items())
    assert max(float((expected[i] - w[i]).norm()) for i in clients) > 1e-3  # the clients do mix
    alg.begin_round(2)
    assert sorted(alg.cloud) == clients  # the round's clients, no other
    clouds = {i: alg.client_model(i).clone() for i in clients}
    for i in clients:
        assert torch.allclose(clouds[i].double(), expected[i], atol=1e-5)

    result = fed.run_round(2)
    for i in clients:  # each trained from its cloud model, and keeps what it trained
        assert torch.allclose(alg.personal_models[i], alg.train_group(2, [i], clouds[i][None]).params[0], atol=1e-6)
    accuracy = []
    for k in range(4):
        x, y = server.clients.split("test").client(k)
        accuracy.append((server.model.predict(alg.personal_models[k], x).argmax(1) == y).double().mean())
    assert result.scalars["test/acc_mean"] == pytest.approx(float(torch.stack(accuracy).mean()))
    assert 0 <= result.scalars["fedamp/self_weight_min"] <= result.scalars["fedamp/self_weight_mean"] <= 1


@pytest.mark.parametrize(
    "options, name",
    [
        ({"alpha_k": 0.0}, "alpha_k"),
        ({"alpha_k": -1.0}, "alpha_k"),
        ({"lam": -0.1}, "lam"),
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": -2.0}, "sigma"),
    ],
)
def test_fedamp_refuses_bad_options_in_one_line(options, name):
    with pytest.raises(ValueError, match=f"^{name} must") as error:
        FedAMP(**options)
    assert "\n" not in str(error.value)
