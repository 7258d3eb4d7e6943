"""pFedMe and Per-FedAvg: their local steps against hand-worked formulas on quadratics, their clients' rounds against
plain loops written out here, the server updates against hand-computed averages, Per-FedAvg's one-step evaluation,
exact resumption and the refusal of bad options."""

from functools import partial

import pytest
import torch

from fedlight import Federation, FederationConfig, RoundUpdates
from fedlight.aggregators.privacy import PrivacyConfig
from fedlight.algorithms.perfedavg import PerFedAvg, meta_step, replayed
from fedlight.algorithms.pfedme import PFedMe, personalize
from fedlight.datamodules import DigitsFederated, Rotations
from fedlight.plugin.updates import Updates
from fedlight.models import Classifier, FedTSDPCNN

from helpers.federations import every_row, small_federation


def quadratic(A: torch.Tensor, b: torch.Tensor):
    """(f, grad f) of f(x) = 1/2 ||A x - b||^2, as a loss_and_grad function."""
    return lambda x: (0.5 * (A @ x - b).square().sum(), A.T @ (A @ x - b))


def problem(seed: int, rows: int = 5, dim: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=g, dtype=torch.float64), torch.randn(rows, generator=g, dtype=torch.float64)


def snapshot(fed: Federation) -> dict:
    state = fed.state_dict()
    state["algorithm"] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state["algorithm"].items()}
    return state


def resumes_exactly(make, names: tuple[str, ...]) -> None:
    """Round 3 after loading round 2's state into a fresh federation equals round 3 of an uninterrupted run."""
    a = make()
    for r in (1, 2):
        a.run_round(r)
    b = make()
    b.load_state_dict(snapshot(a))
    ra, rb = a.run_round(3), b.run_round(3)
    for name in names:
        assert torch.equal(every_row(getattr(a.algorithm, name)), every_row(getattr(b.algorithm, name))), name
    assert ra.scalars["test/acc_mean"] == rb.scalars["test/acc_mean"]


# ----------------------------------------------------------------------------- pFedMe


def test_pfedme_inner_solver_is_k_gradient_steps_on_the_moreau_problem():
    A, b = problem(0)
    theta0, w = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64), torch.tensor([1.0, 0.5, -0.5], dtype=torch.float64)
    lam, lr, K = 2.0, 0.05, 5
    # by hand: theta <- theta - lr (A^T (A theta - b) + lam (theta - w)) = M theta + c, unrolled K times
    M = torch.eye(3, dtype=torch.float64) - lr * (A.T @ A + lam * torch.eye(3, dtype=torch.float64))
    c = lr * (A.T @ b + lam * w)
    expected = torch.linalg.matrix_power(M, K) @ theta0 + sum(torch.linalg.matrix_power(M, j) @ c for j in range(K))
    before_last = torch.linalg.matrix_power(M, K - 1) @ theta0 + sum(
        torch.linalg.matrix_power(M, j) @ c for j in range(K - 1)
    )
    theta, loss = personalize(quadratic(A, b), theta0, w, lam, lr, K)
    assert torch.allclose(theta, expected, atol=1e-12)
    assert float(loss) == pytest.approx(float(0.5 * (A @ before_last - b).square().sum()), abs=1e-12)
    # and with many steps it solves the Moreau problem: (A^T A + lam I) theta = A^T b + lam w
    solution = torch.linalg.solve(A.T @ A + lam * torch.eye(3, dtype=torch.float64), A.T @ b + lam * w)
    assert torch.allclose(personalize(quadratic(A, b), theta0, w, lam, lr, 2000)[0], solution, atol=1e-10)


def test_pfedme_client_round_and_server_step_match_a_plain_loop():
    lam, K, personal_lr = 3.0, 2, 0.05
    fed = small_federation(PFedMe(lam=lam, K=K, personal_lr=personal_lr), num_clients=2, rounds=1, lr=0.1)
    server, w = fed.server, fed.algorithm.models[0].clone()
    locals_, thetas = [], []
    for client in (0, 1):  # Algorithm 1's client, written out
        local, theta = w.clone(), w.clone()
        for _, step, batch in server.clients.batches(1, client):
            for _ in range(K):
                grad = server.model.loss_and_grad(theta, batch, step)[1]
                theta = theta - personal_lr * (grad + lam * (theta - local))
            local = local - 0.1 * lam * (local - theta)
        locals_.append(local)
        thetas.append(theta)
    fed.run_round(1)
    n = server.clients.train_sizes.double()
    mean = (n[0] * locals_[0].double() + n[1] * locals_[1].double()) / n.sum()
    assert torch.allclose(fed.algorithm.models[0].double(), mean, atol=1e-6)  # beta = 1: the weighted mean
    models, groups = fed.algorithm.evaluation_models()
    assert torch.equal(groups, torch.arange(2))
    for client in (0, 1):  # every client is evaluated with its own theta
        assert torch.allclose(models[client], thetas[client], atol=1e-6)
    assert not torch.allclose(thetas[0], thetas[1])


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
def test_pfedme_server_mixes_the_clients_mean_into_the_global_model_with_beta(beta):
    fed = small_federation(PFedMe(beta=beta), num_clients=3, rounds=1)
    alg, d = fed.algorithm, fed.server.model.num_params
    g = torch.Generator().manual_seed(1)
    w = torch.randn(d, generator=g)
    alg.models[0] = w
    params, thetas = torch.randn(2, d, generator=g), torch.randn(2, d, generator=g)
    untouched = alg.personal_models[1].clone()
    updates = Updates(
        torch.tensor([0, 2]), params, w.repeat(2, 1), torch.tensor([3, 5]), torch.zeros(2), state={"personal": thetas}
    )
    round_updates = RoundUpdates.of(updates)
    alg.aggregate(1, round_updates)
    fed.client_states.write_returned(round_updates)  # what the engine does after the round's hooks
    mean = (3 * params[0].double() + 5 * params[1].double()) / 8
    assert torch.allclose(alg.models[0].double(), (1 - beta) * w.double() + beta * mean, atol=1e-6)
    assert torch.equal(alg.personal_models[0], thetas[0]) and torch.equal(alg.personal_models[2], thetas[1])
    assert torch.equal(alg.personal_models[1], untouched)  # not trained this round: keeps its theta


def test_pfedme_trains_every_client_and_averages_only_the_sampled_ones():
    """Algorithm 1 (train_every_client, the default): all four clients train and keep their new theta; the server
    averages the w_local of the two the round samples (the base class's draw), weighted by training-set size."""
    fed = small_federation(PFedMe(K=1, participation=0.5), num_clients=4, rounds=1)
    alg, server = fed.algorithm, fed.server
    sampled, start = alg.sampled_clients(1), alg.models[0].clone()
    assert len(sampled) == 2 and alg.select_clients(1) == [0, 1, 2, 3]
    alone = [alg.train_group(1, [c], start[None]) for c in range(4)]  # each client's round, as it trains alone
    assert fed.run_round(1).clients_trained == 4
    n = server.clients.train_sizes.double()
    mean = sum(n[c] * alone[c].params[0].double() for c in sampled) / n[sampled].sum()
    everyone = sum(n[c] * alone[c].params[0].double() for c in range(4)) / n.sum()
    assert torch.allclose(alg.models[0].double(), mean, atol=1e-6)
    assert not torch.allclose(alg.models[0].double(), everyone, atol=1e-4)  # the unsampled w_local are not averaged
    for c in range(4):  # every client's theta moved and is stored, the unsampled clients' too
        assert torch.equal(alg.personal_models[c], alone[c].state["personal"][0])
        assert not torch.equal(alg.personal_models[c], server.model.initial_params)


def test_pfedme_trains_only_the_cohort_when_asked_and_refuses_a_cohort_by_default():
    with pytest.raises(ValueError, match=r"clients_per_round allows 2 of 4.*train_every_client: false$"):
        small_federation(PFedMe(K=1), num_clients=4, rounds=1, clients_per_round=2)
    with pytest.raises(ValueError, match=r"^pFedMe with train_every_client .*privacy section$"):
        small_federation(
            PFedMe(K=1, participation=0.5),
            num_clients=4,
            rounds=1,
            privacy=PrivacyConfig(noise_multiplier=0.5, clip=0.5),
        )
    fed = small_federation(PFedMe(K=1, train_every_client=False), num_clients=4, rounds=1, clients_per_round=2)
    cohort = fed.algorithm.select_clients(1)
    assert fed.run_round(1).clients_trained == 2
    for c in range(4):  # the clients outside the cohort keep their theta: the initial model
        assert torch.equal(fed.algorithm.personal_models[c], fed.server.model.initial_params) == (c not in cohort)


def test_pfedme_resumes_exactly():
    resumes_exactly(
        lambda: small_federation(PFedMe(K=2, participation=0.5), num_clients=3, rounds=3), ("models", "personal_models")
    )  # every client trains, the round's sampled two are averaged


@pytest.mark.parametrize(
    "options, name",
    [
        ({"lam": -1.0}, "lam"),
        ({"K": 0}, "K"),
        ({"K": 1.5}, "K"),
        ({"beta": 0.0}, "beta"),
        ({"beta": -1.0}, "beta"),
        ({"personal_lr": 0.0}, "personal_lr"),
    ],
)
def test_pfedme_refuses_bad_options(options, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        PFedMe(**options)


# ----------------------------------------------------------------------------- Per-FedAvg


def test_perfedavg_first_order_step_by_hand_on_quadratics():
    (A1, b1), (A2, b2) = problem(1), problem(2)
    w = torch.tensor([0.5, -0.2, 1.0], dtype=torch.float64)
    alpha, beta = 0.1, 0.3
    temp = w - alpha * A1.T @ (A1 @ w - b1)  # the adaptation step on D1
    expected = w - beta * A2.T @ (A2 @ temp - b2)  # the meta step: the gradient on D2 at the adapted point
    new, loss = meta_step(w, quadratic(A1, b1), quadratic(A2, b2), alpha, beta)
    assert torch.allclose(new, expected, atol=1e-12)
    assert float(loss) == pytest.approx(float(0.5 * (A2 @ temp - b2).square().sum()), abs=1e-12)


def test_perfedavg_hessian_free_step_is_the_exact_second_order_step_on_quadratics():
    (A1, b1), (A2, b2), (A3, b3) = problem(1), problem(2), problem(3)
    w = torch.tensor([0.5, -0.2, 1.0], dtype=torch.float64)
    alpha, beta = 0.1, 0.3
    temp = w - alpha * A1.T @ (A1 @ w - b1)
    g = A2.T @ (A2 @ temp - b2)
    exact = w - beta * (torch.eye(3, dtype=torch.float64) - alpha * A3.T @ A3) @ g  # H(w; D3) = A3^T A3
    new, _ = meta_step(w, quadratic(A1, b1), quadratic(A2, b2), alpha, beta, quadratic(A3, b3), delta=1e-3)
    assert torch.allclose(new, exact, atol=1e-9)  # a central difference of a linear gradient: rounding only
    first_order, _ = meta_step(w, quadratic(A1, b1), quadratic(A2, b2), alpha, beta)
    assert (first_order - exact).abs().max() > 1e-3  # the Hessian term matters here


def test_perfedavg_first_order_client_round_matches_a_plain_loop():
    alpha, beta = 0.05, 0.1
    fed = small_federation(PerFedAvg(alpha=alpha, beta=beta, variant="fo"), num_clients=2, rounds=1)
    server, w = fed.server, fed.algorithm.models[0].clone()
    trained = []
    for client in (0, 1):
        v = w.clone()
        for (_, step, d1), (_, _, d2) in zip(
            server.clients.batches(1, client), server.clients.batches(1, client, purpose="meta")
        ):
            temp = v - alpha * server.model.loss_and_grad(v, d1, step)[1]
            v = v - beta * server.model.loss_and_grad(temp, d2, step)[1]
        trained.append(v)
    fed.run_round(1)
    n = server.clients.train_sizes.double()
    mean = (n[0] * trained[0].double() + n[1] * trained[1].double()) / n.sum()  # the engine's FedAvg
    assert torch.allclose(fed.algorithm.models[0].double(), mean, atol=1e-6)


def test_perfedavg_evaluates_each_client_after_one_adaptation_step_from_the_global_model():
    alpha = 0.2
    fed = small_federation(PerFedAvg(alpha=alpha, beta=0.1, variant="fo"), num_clients=3, rounds=1)
    result = fed.run_round(1)
    server, w = fed.server, fed.algorithm.models[0]
    models, groups = fed.algorithm.evaluation_models()
    assert torch.equal(groups, torch.arange(3))
    for client in range(3):
        _, _, batch = next(
            server.clients.batches(0, client, epochs=1, purpose="adapt")
        )  # one batch of its training data
        assert len(batch[1]) == min(32, int(server.clients.train_sizes[client]))
        by_hand = w - alpha * server.model.loss_and_grad(w, batch)[1]
        assert torch.equal(models[client], by_hand)
        assert not torch.equal(by_hand, w)
        x, y = fed.data.test.client(client)  # and the round's evaluation used that model
        accuracy = float((server.model.predict(by_hand, x).argmax(dim=1) == y).float().mean())
        assert result.per_client["acc"][client] == pytest.approx(accuracy)
    assert torch.equal(models[1], fed.algorithm.evaluation_models()[0][1])  # deterministic


def test_hessian_free_differences_see_the_same_dropout_masks():
    torch.manual_seed(0)
    model = Classifier(FedTSDPCNN(1, 10, 8), lr=0.1)  # dropout .25 and .5
    data = DigitsFederated(num_clients=2, partition=Rotations(2))
    fed = Federation(
        data, model, PerFedAvg(), FederationConfig(rounds=1, batch_size=32, accelerator="cpu", vectorize=0)
    )
    server, w = fed.server, fed.algorithm.models[0]
    _, _, batch = next(server.clients.batches(1, 0, purpose="hessian"))
    plain = partial(server.model.loss_and_grad, batch=batch)
    assert not torch.equal(plain(w)[1], plain(w)[1])  # two draws of the masks
    same = replayed(plain, w.device)
    assert torch.equal(same(w)[1], same(w)[1])


def test_perfedavg_resumes_exactly():
    resumes_exactly(lambda: small_federation(PerFedAvg(alpha=0.05, beta=0.1), num_clients=3, rounds=3), ("models",))


@pytest.mark.parametrize(
    "options, name",
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": -0.1}, "alpha"),
        ({"beta": 0.0}, "beta"),
        ({"variant": "so"}, "variant"),
        ({"delta": 0.0}, "delta"),
    ],
)
def test_perfedavg_refuses_bad_options(options, name):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        PerFedAvg(**options)
