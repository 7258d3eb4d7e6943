"""DP under FedBuff: each client's releases are accounted, with no amplification by sampling (who arrives follows
the devices, not a uniform draw), worked by hand on hand-set arrival times; a buffer of the whole cohort adds the
synchronous run's noise; a resumed run reports the same epsilon."""

import copy

import numpy as np
import pytest
import torch

from fedlight.aggregators.privacy import PrivacyConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.system.config import SystemConfig
from fedlight.system.system_model import SystemModel

from helpers.federations import small_federation
from helpers.system_times import hand_set_times

ORDERS = np.array([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))  # Opacus's default RDP orders


def unsampled_gaussian_epsilon(z: float, releases: int, delta: float = 1e-5) -> float:
    """epsilon of `releases` Gaussian mechanisms of noise z composed, no sampling: RDP alpha x releases / (2 z^2) at
    each order alpha, converted to (epsilon, delta) as Balle et al. 2020 (the conversion Opacus uses)."""
    rdp = ORDERS * releases / (2 * z**2)
    return float(np.min(rdp + np.log1p(-1 / ORDERS) - (np.log(delta) + np.log(ORDERS)) / (ORDERS - 1)))


def federation(
    system: SystemConfig | None, rounds: int, privacy: PrivacyConfig, num_clients: int = 6, per_round: int = 3
):
    return small_federation(
        FedAvg(),
        num_clients=num_clients,
        rounds=rounds,
        clients_per_round=per_round,
        eval_every=rounds,
        system=system,
        privacy=privacy,
    )


def test_the_client_released_most_often_sets_epsilon_hand_set_arrivals():
    """Three clients, 3 s, 1 s and 2 s a round, one arrival an update (as test_system_fedbuff's hand-set times):
    clients 1, 2, 1, 0 arrive, so the most released client has 1, 1, 2, 2 releases after each round."""
    fed = federation(
        SystemConfig(buffer_size=1, concurrency=3),
        4,
        PrivacyConfig(noise_multiplier=2.0, clip=1.0),
        num_clients=3,
        per_round=3,
    )
    model = fed.extension(SystemModel)
    hand_set_times(model, np.array([3.0, 1.0, 2.0]), np.zeros(3))
    scalars = [fed.run_round(t).scalars for t in range(1, 5)]
    assert [s["privacy/most_releases"] for s in scalars] == [1, 1, 2, 2]
    for s, releases in zip(scalars, [1, 1, 2, 2]):
        assert s["privacy/epsilon"] == pytest.approx(unsampled_gaussian_epsilon(2.0, releases), rel=1e-9)


def test_a_buffer_of_the_whole_cohort_adds_the_synchronous_noise():
    """Every client every round (K = C = 6 of 6): the noised models are the synchronous DP-FedAvg's bit for bit, and
    both epsilons are 3 unsampled Gaussian mechanisms' (sample rate 1 either way)."""
    privacy = PrivacyConfig(noise_multiplier=1.5, clip=0.5)
    runs = [federation(system, 3, privacy, per_round=6) for system in (None, SystemConfig(buffer_size=6))]
    last = [[fed.run_round(t) for t in (1, 2, 3)][-1] for fed in runs]
    assert torch.equal(runs[0].algorithm.models, runs[1].algorithm.models)
    plain = federation(None, 3, None, per_round=6)
    for t in (1, 2, 3):
        plain.run_round(t)
    assert not torch.allclose(plain.algorithm.models, runs[1].algorithm.models, atol=1e-3)  # the noise is there
    for result in last:
        assert result.scalars["privacy/epsilon"] == pytest.approx(unsampled_gaussian_epsilon(1.5, 3), rel=1e-9)


def test_target_epsilon_alone_keeps_a_client_arriving_every_round_within_it():
    fed = federation(SystemConfig(buffer_size=6), 4, PrivacyConfig(target_epsilon=8.0, clip=1.0), per_round=6)
    scalars = [fed.run_round(t).scalars for t in range(1, 5)]
    assert scalars[-1]["privacy/most_releases"] == 4
    assert 0.95 * 8.0 <= scalars[-1]["privacy/epsilon"] <= 8.0


def test_a_resumed_buffered_private_run_reports_the_same_epsilon():
    system, privacy = SystemConfig(buffer_size=2, concurrency=4), PrivacyConfig(noise_multiplier=2.0, clip=1.0)
    whole = federation(system, 3, privacy)
    rounds = [whole.run_round(1), whole.run_round(2)]
    saved = copy.deepcopy(whole.state_dict())
    rounds.append(whole.run_round(3))
    resumed = federation(system, 3, privacy)
    resumed.load_state_dict(saved)
    last = resumed.run_round(3)
    assert last.scalars == rounds[2].scalars and last.scalars["privacy/epsilon"] > rounds[1].scalars["privacy/epsilon"]
    assert torch.equal(resumed.algorithm.models, whole.algorithm.models)


def test_adaptive_clipping_takes_the_share_of_the_arrivals(monkeypatch):
    """Round 1 dispatches 3 clients and one arrives (buffer 1): the share within the clip is of 1 update, not 3."""
    from fedlight.aggregators.privacy import PrivacyMechanism

    shares_of = []
    monkeypatch.setattr(PrivacyMechanism, "_adapt_clip", lambda self, clients: shares_of.append(clients))
    fed = federation(
        SystemConfig(buffer_size=1, concurrency=3),
        2,
        PrivacyConfig(noise_multiplier=1.0, clip=1.0, adaptive=True, count_noise=1.0),
        num_clients=3,
    )
    fed.run_round(1)
    assert shares_of == [1]
