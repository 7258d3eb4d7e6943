"""FedNova, FedDyn, MOON and FedDF, each against an independent computation of its defining step: the normalized
average worked from FedAvg's trained clients, the dynamic regularizer's two local steps and server state on softmax
regression's gradient written out by hand, MOON's contrastive step re-written in plain torch, FedDF's distillation
re-run with torch's Adam on hand-written logits; then their refusals and a crashed run resumed through the CLI."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedlight import Federation, FederationConfig
from fedlight.aggregators.privacy import PrivacyConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.feddf import FedDF
from fedlight.algorithms.feddyn import FedDyn
from fedlight.algorithms.fednova import FedNova, gradient_coefficient_sum
from fedlight.algorithms.moon import MOON
from fedlight.datamodules import DigitsFederated, QuantitySkew, Rotations
from fedlight.models import Classifier

from helpers.federations import every_row, small_federation
from helpers.resume import resumed_and_whole
from helpers.softmax_regression import LR, client_data, linear_federation, linear_gradient, resumed_equals_uninterrupted


# ----------------------------------------------------------------------------- FedNova


def test_gradient_coefficients_of_heavy_ball_sgd_are_its_displacement_on_a_unit_gradient():
    """||a||_1 is how far tau steps of torch's SGD move a parameter whose gradient is always 1 (at lr 1)."""
    assert gradient_coefficient_sum(torch.tensor([3]), 0.5).item() == pytest.approx(1.75 + 1.5 + 1)  # worked by hand
    for tau, rho in ((1, 0.9), (5, 0.0), (7, 0.5), (20, 0.9)):
        p = torch.zeros(1, requires_grad=True)
        sgd = torch.optim.SGD([p], lr=1.0, momentum=rho)
        for _ in range(tau):
            sgd.zero_grad()
            p.sum().backward()
            sgd.step()
        assert gradient_coefficient_sum(torch.tensor([tau]), rho).item() == pytest.approx(-p.item(), rel=1e-6)


def test_fednova_round_is_the_normalized_average_of_fedavgs_clients():
    partition = QuantitySkew(min_size=30)
    fedavg = small_federation(FedAvg(), num_clients=4, partition=partition)
    trained = fedavg.execution.train(1, [0, 1, 2, 3]).params.double()
    sizes = fedavg.server.clients.train_sizes.double()
    steps = torch.tensor([math.ceil(n / 32) for n in sizes.tolist()], dtype=torch.float64)  # one epoch, batch 32
    assert steps.max() > steps.min()
    x = fedavg.algorithm.models[0].double()
    p = sizes / sizes.sum()
    tau_eff = (p * steps).sum()
    expected = x + tau_eff * (p[:, None] * (trained - x) / steps[:, None]).sum(0)
    fednova = small_federation(FedNova(), num_clients=4, partition=partition)
    fednova.run_round(1)
    model = fednova.algorithm.models[0].double()
    assert torch.allclose(model, expected, atol=1e-6)
    fedavg_model = (p[:, None] * trained).sum(0)
    assert not torch.allclose(model, fedavg_model, atol=1e-4)  # unequal steps: not FedAvg


def test_fednova_normalizes_by_the_steps_a_client_took_when_its_work_is_cut_short():
    fed = small_federation(FedNova(), num_clients=4, partition=QuantitySkew(min_size=30))
    full = [fed.server.clients.local_steps(c) for c in range(4)]
    with fed.server.clients.trainer.work_shares.during({1: 0.5}):
        updates = fed.execution.train(1, [0, 1, 2, 3])
    sent = updates.state["fednova_steps"].tolist()
    assert sent == [full[0], max(1, full[1] // 2), full[2], full[3]]


def test_fednova_with_momentum_sends_the_heavy_ball_coefficients():
    fed = small_federation(FedNova(), num_clients=3, momentum=0.5)
    updates = fed.execution.train(1, [0, 1, 2])
    for row, client in enumerate([0, 1, 2]):
        tau = fed.server.clients.local_steps(client)
        by_hand = sum((1 - 0.5 ** (tau - k)) / 0.5 for k in range(tau))
        assert updates.state["fednova_steps"][row].item() == pytest.approx(by_hand, rel=1e-6)


def test_fednova_refuses_an_optimizer_it_cannot_normalize():
    model = Classifier(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), optimizer="adam", lr=0.01)
    config = FederationConfig(rounds=1, local_epochs=1, batch_size=32, accelerator="cpu", vectorize=0)
    with pytest.raises(ValueError, match="FedNova normalizes by the local steps of SGD.*Adam"):
        Federation(DigitsFederated(num_clients=3, partition=Rotations(2)), model, FedNova(), config, seed=0)


# ----------------------------------------------------------------------------- FedDyn


def two_regularized_steps(x, g_k, alpha, X, y):
    """Two full-batch steps of FedDyn's local objective from x, by hand: grad L - g_k + alpha (theta - x)."""
    theta = x.clone()
    for _ in range(2):
        theta = theta - LR * (linear_gradient(theta, X, y) - g_k + alpha * (theta - x))
    return theta


def test_feddyn_local_steps_client_state_and_server_state_by_hand():
    alpha = 0.1
    fed = linear_federation(
        FedDyn(alpha=alpha, participation=0.5),
        num_clients=4,
        batch_size=4096,
        local_epochs=2,
        partition=QuantitySkew(min_size=30),
    )
    alg = fed.algorithm
    x = alg.models[0].double()
    clients = alg.select_clients(1)
    fed.run_round(1)
    zero = torch.zeros_like(x)
    trained = {k: two_regularized_steps(x, zero, alpha, *client_data(fed, k)) for k in clients}
    mean = sum(trained.values()) / len(clients)  # unweighted
    h = -alpha * (len(clients) / 4) * (mean - x)
    assert torch.allclose(alg.h.double(), h, atol=1e-6)
    assert torch.allclose(alg.models[0].double(), mean - h / alpha, atol=1e-5)
    g = every_row(alg.gradients).double()
    for k in range(4):
        expected = -alpha * (trained[k] - x) if k in clients else zero
        assert torch.allclose(g[k], expected, atol=1e-6)
    # round 2: the linear term of a client that trained in round 1 enters its steps
    x2 = alg.models[0].double()
    clients2 = alg.select_clients(2)
    updates = fed.execution.train(2, clients2)
    for row, k in enumerate(clients2):
        expected = two_regularized_steps(x2, g[k], alpha, *client_data(fed, k))
        assert torch.allclose(updates.params[row].double(), expected, atol=1e-5)
    assert any(k in clients for k in clients2)


def test_feddyn_resumes_exactly():
    resumed_equals_uninterrupted(
        lambda: small_federation(FedDyn(participation=0.5), num_clients=4, rounds=3), ("h", "gradients")
    )


# ----------------------------------------------------------------------------- MOON


def mlp() -> nn.Module:
    torch.manual_seed(0)  # built before the federation seeds: the same start in every run
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def mlp_forward(fed, flat, X):
    """(features, logits) of the two-layer network at the flat model `flat`, written out."""
    t = fed.server.model.named_tensors(flat)
    z = torch.relu(X @ t["network.1.weight"].T + t["network.1.bias"])
    return z, z @ t["network.3.weight"].T + t["network.3.bias"]


def test_moons_first_round_is_fedavgs():
    """The previous model is the global one in round 1: the contrastive term is the constant log 2."""
    moon = linear_federation(MOON(mu=5.0), num_clients=3, network=mlp())
    fedavg = linear_federation(FedAvg(), num_clients=3, network=mlp())
    moon.run_round(1), fedavg.run_round(1)
    assert torch.allclose(moon.algorithm.models, fedavg.algorithm.models, atol=1e-6)


def test_moons_local_steps_match_a_plain_torch_rewrite_of_its_loss():
    mu, tau = 2.0, 0.5
    fed = linear_federation(MOON(mu=mu, temperature=tau), num_clients=3, network=mlp(), batch_size=4096, local_epochs=2)
    fed.run_round(1)
    alg = fed.algorithm
    x, previous = alg.models[0].clone(), every_row(alg.previous)
    assert not torch.allclose(previous[0], x)
    updates = fed.execution.train(2, [0, 1, 2])
    for k in range(3):
        X, y = client_data(fed, k)
        X = X.reshape(len(X), -1)
        z_global, z_previous = mlp_forward(fed, x, X)[0], mlp_forward(fed, previous[k], X)[0]
        theta = x.clone()
        for _ in range(2):  # two full-batch SGD steps
            theta.requires_grad_(True)
            z, logits = mlp_forward(fed, theta, X)
            positive = torch.exp(F.cosine_similarity(z, z_global) / tau)
            negative = torch.exp(F.cosine_similarity(z, z_previous) / tau)
            loss = F.cross_entropy(logits, y) + mu * (-torch.log(positive / (positive + negative))).mean()
            (grad,) = torch.autograd.grad(loss, theta)
            theta = (theta - LR * grad).detach()
        assert torch.allclose(updates.params[k], theta, atol=1e-5)
        assert torch.allclose(updates.state["moon_previous"][k], updates.params[k])


def test_the_clock_counts_moons_two_frozen_forward_passes_but_one_model_received():
    fed = small_federation(MOON(), num_clients=3)
    fed.server.clients.work.take()
    fed.execution.train(1, [0, 1, 2])
    done = fed.server.clients.work.take()
    sizes = fed.server.clients.train_sizes.tolist()
    assert done.forward_samples.tolist() == [2.0 * n for n in sizes]  # one local epoch: each sample once, 2 models
    assert done.steps.tolist() == [math.ceil(n / 32) for n in sizes] and done.models_used.tolist() == [1, 1, 1]


def test_moon_resumes_exactly():
    resumed_equals_uninterrupted(
        lambda: small_federation(MOON(participation=0.5), num_clients=4, rounds=3), ("previous",)
    )


# ----------------------------------------------------------------------------- FedDF


def test_feddf_distills_the_mean_logits_into_the_uniform_average_as_torchs_adam_does():
    """On a network with a hidden layer (a linear model's mean logits are the mean model's: nothing to distill)."""
    steps = 3
    fedavg = linear_federation(FedAvg(), num_clients=3, public_size=60, network=mlp())
    trained = fedavg.execution.train(1, [0, 1, 2]).params
    public = fedavg.server.data.inputs(fedavg.server.data.public_x).reshape(60, -1)
    teacher = torch.stack([mlp_forward(fedavg, p, public)[1] for p in trained]).mean(0)
    student = trained.mean(0).clone().requires_grad_(True)  # every client counted once
    adam = torch.optim.Adam([student], lr=1e-3)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(adam, T_max=steps)
    for _ in range(steps):
        adam.zero_grad()
        log_student = F.log_softmax(mlp_forward(fedavg, student, public)[1], 1)
        loss = (F.softmax(teacher, 1) * (F.log_softmax(teacher, 1) - log_student)).sum(1).mean()
        loss.backward()
        assert student.grad.norm() > 1e-4
        student.grad *= min(1.0, 5.0 / student.grad.norm().item())  # the norm clipped at 5
        adam.step()
        schedule.step()
    feddf = linear_federation(
        FedDF(steps=steps, patience=None, batch_size=4096), num_clients=3, public_size=60, network=mlp()
    )
    feddf.run_round(1)
    # Adam divides by the root of the second moment, so an entry whose gradient is near zero amplifies float error
    assert torch.allclose(feddf.algorithm.models[0], student.detach(), atol=2e-5)  # 2 % of one step
    assert not torch.allclose(feddf.algorithm.models[0], trained.mean(0), atol=1e-4)


def test_feddf_keeps_the_student_best_on_the_held_out_public_rows():
    fed = linear_federation(
        FedDF(steps=400, lr=0.05, check_every=5, patience=10, batch_size=16), num_clients=3, public_size=60
    )
    alg = fed.algorithm
    assert len(alg.held_out) == 12 and not set(alg.held_out.tolist()) & set(alg.distilled.tolist())
    assert sorted(alg.held_out.tolist() + alg.distilled.tolist()) == list(range(60))  # every row once
    checks, divergence = [], alg._divergence

    def recorded(student, target):
        checks.append((divergence(student, target), student.detach().clone()))
        return checks[-1][0]

    alg._divergence = recorded
    fed.run_round(1)
    best = min(range(len(checks)), key=lambda i: checks[i][0])
    assert torch.equal(alg.models[0], checks[best][1])
    assert len(checks) - 1 - best == 2 < 400 // 5  # stopped two checks (10 steps) after its best, not at the end


def test_feddf_refuses_a_run_without_public_data_and_under_privacy():
    with pytest.raises(ValueError, match="FedDF distills on the server's unlabelled public data.*data.public_size"):
        small_federation(FedDF(), num_clients=3)
    with pytest.raises(ValueError, match="feddf_logits"):
        small_federation(
            FedDF(steps=2, patience=None),
            num_clients=4,
            public_size=40,
            privacy=PrivacyConfig(noise_multiplier=1.0, clip=1.0),
        ).run_round(1)


@pytest.mark.parametrize("bad", [dict(steps=0), dict(lr=0.0), dict(patience=50, check_every=100)])
def test_feddf_refuses_bad_settings(bad):
    with pytest.raises(ValueError, match="FedDF's"):
        FedDF(**bad)


# ----------------------------------------------------------------------------- crashed and resumed


@pytest.mark.parametrize(
    "extra",
    [
        ["--algorithm", "fednova"],
        ["--algorithm", "feddyn"],
        ["--algorithm", "moon"],
        [
            "--algorithm",
            "feddf",
            "--algorithm.init_args.steps",
            "20",
            "--algorithm.init_args.check_every",
            "5",
            "--algorithm.init_args.patience",
            "10",
            "--data.public_size",
            "60",
        ],
    ],
)
def test_a_crashed_run_resumes_with_the_uninterrupted_numbers(tmp_path, tiny_run_args, monkeypatch, extra):
    crashed, whole = resumed_and_whole(tiny_run_args + extra, tmp_path, monkeypatch)
    assert crashed == whole and len(whole) == 3


# ----------------------------------------------------------------------------- the measured sweeps


@pytest.mark.parametrize("name", ["baselines_skew", "fednova_partial_work", "ifca_fedadam"])
def test_each_measured_sweeps_runs_are_valid_fit_configs(name, tmp_path, capsys):
    """Seed 0 of every entry of the sweeps behind docs/guides/global_baselines.md, printed by `fit --print_config`."""
    from pathlib import Path

    from fedlight.run import sweep
    from fedlight.run.cli import main

    path = Path(__file__).resolve().parents[2] / "configs" / "sweeps" / f"{name}.yaml"
    config, base = sweep.load(path)
    config.output_dir = str(tmp_path)
    firsts = [c for c in sweep.combinations(config, path) if c.name.endswith("-s0")]
    assert len(firsts) == len(config.algorithms) and config.seeds == [0, 1, 2]
    for combination in firsts:
        with pytest.raises(SystemExit) as stop:
            main(sweep.fit_args(combination, base, config) + ["--print_config"])
        assert stop.value.code in (0, None), combination.name
        printed = capsys.readouterr().out
        if combination.name in ("fedadam-s0", "fedyogi-s0", "ifca-fedadam-s0"):
            assert f"kind: {'yogi' if 'yogi' in combination.name else 'adam'}" in printed
