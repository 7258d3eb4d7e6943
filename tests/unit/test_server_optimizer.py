"""The server optimizer (`fedlight.aggregators.server_optimizer`): Reddi et al.'s Algorithm 2 worked by hand on
numbers, then in runs against the plain run's aggregate: FedAvg (one state), IFCA (one per cluster), FedPer (the
shared part only), DP (the noised aggregate, epsilon unchanged), Local refused, and a resumed run's numbers."""

from __future__ import annotations

import math

import pytest
import torch

from fedlight.aggregators.privacy import PrivacyConfig
from fedlight.aggregators.server_optimizer import ServerOptimizer, ServerOptimizerConfig, server_step
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer
from fedlight.algorithms.ifca import IFCA
from fedlight.algorithms.local import Local

from helpers.federations import small_federation
from helpers.resume import resumed_and_whole


def test_adam_yogi_adagrad_and_momentum_steps_worked_by_hand():
    """Two steps on one entry, Delta = 0.5 then -0.25, lr 0.1, beta1 0.9, beta2 0.99, tau 0.01 (v starts at 1e-4)."""
    config = dict(lr=0.1, beta1=0.9, beta2=0.99, tau=0.01)
    deltas = [torch.tensor([0.5]), torch.tensor([-0.25])]
    expected = {}
    m1, m2 = 0.1 * 0.5, 0.9 * 0.1 * 0.5 + 0.1 * -0.25
    v_adam = [0.99 * 1e-4 + 0.01 * 0.25]
    v_adam.append(0.99 * v_adam[0] + 0.01 * 0.0625)
    v_yogi = [1e-4 - 0.01 * 0.25 * -1]  # sign(1e-4 - 0.25) = -1: v grows
    v_yogi.append(v_yogi[0] - 0.01 * 0.0625 * math.copysign(1, v_yogi[0] - 0.0625))
    v_adagrad = [1e-4 + 0.25]
    v_adagrad.append(v_adagrad[0] + 0.0625)
    for kind, v in (("adam", v_adam), ("yogi", v_yogi), ("adagrad", v_adagrad)):
        expected[kind] = [0.1 * m1 / (math.sqrt(v[0]) + 0.01), 0.1 * m2 / (math.sqrt(v[1]) + 0.01)]
    expected["momentum"] = [0.1 * 0.5, 0.1 * (0.9 * 0.5 - 0.25)]
    expected["sgd"] = [0.1 * 0.5, 0.1 * -0.25]
    for kind, steps in expected.items():
        state: dict = {}
        found = [float(server_step(ServerOptimizerConfig(kind=kind, **config), d, state)) for d in deltas]
        assert found == pytest.approx(steps, rel=1e-12), kind


def test_defaults_and_bad_settings():
    assert ServerOptimizerConfig("adam").server_lr == 0.01 and ServerOptimizerConfig("sgd").server_lr == 1.0
    with pytest.raises(ValueError, match="server_optimizer.kind must be one of sgd, momentum, adam, yogi, adagrad"):
        ServerOptimizerConfig("adamw")
    with pytest.raises(ValueError, match=r"server_optimizer.beta2 must be in \[0, 1\)"):
        ServerOptimizerConfig("adam", beta2=1.0)


def one_round(algorithm, optimizer=None, **settings):
    fed = small_federation(algorithm, num_clients=4, rounds=2, server_optimizer=optimizer, **settings)
    before = fed.algorithm.models.clone()
    fed.run_round(1)
    return fed, before, fed.algorithm.models.clone()


def test_fedadams_first_round_is_the_plain_aggregate_stepped_by_hand():
    config = ServerOptimizerConfig("adam", lr=0.05, tau=1e-2)
    _, start, plain = one_round(FedAvg())
    fed, _, stepped = one_round(FedAvg(), config)
    delta = plain.double() - start.double()
    m, v = 0.1 * delta, 0.99 * 1e-4 + 0.01 * delta**2
    assert torch.allclose(stepped.double(), start.double() + 0.05 * m / (v.sqrt() + 1e-2), atol=1e-6)
    assert list(fed.extension(ServerOptimizer).states) == ["1.0"]  # one model: one state


def test_sgd_with_lr_1_is_fedavg():
    _, _, plain = one_round(FedAvg())
    _, _, stepped = one_round(FedAvg(), ServerOptimizerConfig("sgd"))
    assert torch.allclose(stepped, plain, atol=1e-6)


def test_ifca_keeps_one_state_per_cluster_and_fedper_steps_only_its_shared_part():
    fed, _, _ = one_round(IFCA(num_clusters=2), ServerOptimizerConfig("adam"))
    states = fed.extension(ServerOptimizer).states
    assert set(states) <= {"1.0", "1.1"} and len(states) == int((fed.algorithm.assignment.bincount() > 0).sum())
    fed, start, stepped = one_round(FedPer(), ServerOptimizerConfig("adam"))
    head = fed.algorithm.personal_mask
    assert torch.equal(stepped[:, head], start[:, head])  # the personal head is never aggregated, never stepped
    assert not torch.equal(stepped[:, ~head], start[:, ~head])
    assert float(fed.extension(ServerOptimizer).states["1.0"]["m"][head].abs().max()) == 0.0


def test_under_privacy_it_steps_the_noised_aggregate_and_epsilon_is_unchanged():
    privacy = PrivacyConfig(noise_multiplier=1.0, clip=1.0)
    plain, _, _ = one_round(FedAvg(), privacy=privacy)
    fed, start, stepped = one_round(FedAvg(), ServerOptimizerConfig("sgd", lr=0.5), privacy=privacy)
    noised = plain.algorithm.models  # the same seeds: the same noised aggregate
    assert torch.allclose(stepped, start + 0.5 * (noised - start), atol=1e-6)
    assert fed.extensions.summary()["privacy"]["epsilon"] == plain.extensions.summary()["privacy"]["epsilon"]


def test_local_keeps_no_server_model_and_is_refused_after_round_1():
    fed = small_federation(Local(), num_clients=4, rounds=1, server_optimizer=ServerOptimizerConfig("adam"))
    with pytest.raises(
        ValueError,
        match="Local combined its clients' updates in round 1 without the engine's "
        "cluster aggregator, so the server_optimizer section could not apply",
    ):
        fed.run_round(1)


def test_a_resumed_fedadam_ifca_run_ends_with_the_uninterrupted_numbers(tmp_path, tiny_run_args, monkeypatch):
    """Crashed in round 3 and resumed: the clusters' Adam moments come back from the checkpoint."""
    args = tiny_run_args + ["--algorithm", "ifca", "--server_optimizer.kind", "adam"]
    crashed, whole = resumed_and_whole(args, tmp_path, monkeypatch)
    assert crashed == whole and len(whole) == 3
