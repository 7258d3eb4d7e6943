"""FedBuff (`system.buffer_size`): with K = C = the cohort it is synchronous FedAvg bit for bit; a stale update is
weighted 1 / sqrt(1 + tau) and re-based on the current model, worked by hand; clients arrive in the order their
hand-set times say; and a resumed run ends as an uninterrupted one."""

import copy
import re

import numpy as np
import pytest
import torch

from fedlight.algorithms.fedavg import FedAvg
from fedlight.plugin.updates import Updates
from fedlight.system.buffered import InFlight, staleness_weight, take_arrivals
from fedlight.system.config import SystemConfig
from fedlight.system.system_model import SystemModel

from helpers.federations import small_federation
from helpers.system_times import hand_set_times


def federation(system: SystemConfig, rounds: int, num_clients: int = 6, per_round: int = 3):
    """FedAvg on digits clients, `per_round` a round, evaluated after the last round."""
    return small_federation(
        FedAvg(), num_clients=num_clients, rounds=rounds, clients_per_round=per_round, eval_every=rounds, system=system
    )


def test_a_buffer_of_the_whole_cohort_is_synchronous_fedavg_bit_for_bit():
    runs = []
    for system in (SystemConfig(), SystemConfig(buffer_size=3)):
        fed = federation(system, 2)
        runs.append((fed, [fed.run_round(t) for t in (1, 2)]))
    (sync, sync_rounds), (buffered, buffered_rounds) = runs
    assert torch.equal(sync.algorithm.models, buffered.algorithm.models)
    for a, b in zip(sync_rounds, buffered_rounds):
        assert a.training == b.training and a.evaluation == b.evaluation
        assert b.scalars["system/staleness_mean"] == 0.0 and b.scalars["system/in_flight"] == 0
        assert b.scalars["system/round_virtual_s"] == a.scalars["system/round_virtual_s"]


def test_staleness_weights_are_one_over_the_root_of_one_plus_tau():
    assert staleness_weight(np.array([0, 1, 3, 8]), "polynomial").tolist() == pytest.approx([1, 2**-0.5, 0.5, 1 / 3])
    assert staleness_weight(np.array([0, 5]), "constant").tolist() == [1.0, 1.0]


def test_the_earliest_arrivals_come_re_based_on_the_current_model_a_fresh_one_exactly_as_trained():
    current = {0: torch.tensor([10.0, 20.0]), 1: torch.tensor([10.0, 20.0]), 2: torch.tensor([3.0, 3.0])}
    waiting = InFlight(
        np.array([0, 1]),
        np.array([0, 2]),
        np.array([5.0, 1.0]),  # changes [2, -4] and [1, 1]
        torch.tensor([[3.0, -3.0], [1.0, 1.0]]),
        torch.tensor([[1.0, 1.0], [0.0, 0.0]]),
        torch.tensor([0.5, 0.25]),
    )
    fresh = Updates(
        torch.tensor([2]),
        torch.tensor([[7.1, 8.3]]),
        torch.tensor([[3.0, 3.0]]),
        torch.tensor([9.0]),
        torch.tensor([0.75]),
    )
    sizes = torch.tensor([4.0, 5.0, 9.0])
    arrived, left = take_arrivals(waiting, fresh, np.array([0.5]), 3, 2, "polynomial", current.__getitem__, sizes)
    got = arrived.updates  # client 2 at 0.5 s (fresh, tau 0) and client 1 at 1 s (version 2 of 3: tau 1)
    assert got.clients.tolist() == [1, 2] and arrived.staleness.tolist() == [1, 0] and arrived.last_s == 1.0
    assert torch.allclose(got.params[0], torch.tensor([10.0, 20.0]) + 2**-0.5, rtol=0, atol=1e-6)
    assert torch.equal(got.params[1], torch.tensor([7.1, 8.3]))  # exactly as trained, no 0 x ... term
    assert torch.equal(got.starts, torch.tensor([[10.0, 20.0], [3.0, 3.0]]))
    assert got.num_samples.tolist() == [5.0, 9.0] and got.train_loss.tolist() == [0.25, 0.75]
    assert left.clients.tolist() == [0]
    later, empty = take_arrivals(left, None, np.zeros(0), 3, 1, "polynomial", current.__getitem__, sizes)
    assert later.updates.params.tolist() == [[11.0, 18.0]]  # [10, 20] + 1/2 x [2, -4]: version 0 at 3, tau 3
    assert len(empty) == 0


def test_clients_arrive_in_the_order_of_their_hand_set_times():
    """Three clients, 3 s, 1 s and 2 s a round, all in flight, one arrival an update: arrivals 1 (1 s), 2 (2 s,
    dispatched first of the two due then), 1 again (2 s), 0 (3 s)."""
    fed = federation(SystemConfig(buffer_size=1, concurrency=3), 4, num_clients=3, per_round=3)
    model = fed.extension(SystemModel)
    hand_set_times(model, np.array([3.0, 1.0, 2.0]), np.zeros(3))
    flying, times, staleness = [], [], []
    for t in range(1, 5):
        scalars = fed.run_round(t).scalars
        flying.append(sorted(model.in_flight.clients.tolist()))
        times.append(scalars["system/virtual_time_s"])
        staleness.append(scalars["system/staleness_mean"])
    assert flying == [[0, 2], [0, 1], [0, 2], [1, 2]]
    assert times == [1.0, 2.0, 2.0, 3.0] and staleness == [0.0, 1.0, 1.0, 3.0]


def test_a_resumed_buffered_run_ends_as_an_uninterrupted_one():
    system = SystemConfig(buffer_size=2, concurrency=4, staleness="polynomial")
    whole = federation(system, 3)
    rounds = [whole.run_round(1), whole.run_round(2)]
    saved = copy.deepcopy(whole.state_dict())
    rounds.append(whole.run_round(3))
    assert any(r.scalars["system/staleness_mean"] > 0 for r in rounds)
    resumed = federation(system, 3)
    resumed.load_state_dict(saved)
    last = resumed.run_round(3)
    assert last.scalars == rounds[2].scalars and last.training == rounds[2].training
    assert torch.equal(resumed.algorithm.models, whole.algorithm.models)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"buffer_size": 4, "concurrency": 3}, "above system.concurrency"),
        ({"buffer_size": 2, "concurrency": 7}, "the run has 6 clients"),
        ({"buffer_size": 2, "deadline_s": 3.0}, "system.deadline_s shapes a synchronous round"),
    ],
)
def test_bad_buffers_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        small_federation(FedAvg(), rounds=1, clients_per_round=3, system=SystemConfig(**settings)).run_round(1)
    assert "\n" not in str(error.value)


def test_fedbuffs_server_learning_rate_is_the_server_optimizers_sgd_step():
    """FedBuff's Algorithm 1 ends each update with w <- w - eta_g x the buffer's mean change: `server_optimizer: {kind:
    sgd, lr: eta_g}` beside `system.buffer_size`. At eta_g = 0.5 the model moves half as far as FedBuff's plain update
    from the same state (C = 4 in flight, K = 2: stale arrivals in round 2)."""
    from fedlight.aggregators.server_optimizer import ServerOptimizerConfig

    system = SystemConfig(buffer_size=2, concurrency=4)
    plain = small_federation(FedAvg(), num_clients=6, rounds=2, clients_per_round=4, eval_every=2, system=system)
    stepped = small_federation(
        FedAvg(),
        num_clients=6,
        rounds=2,
        clients_per_round=4,
        eval_every=2,
        system=system,
        server_optimizer=ServerOptimizerConfig(kind="sgd", lr=0.5),
    )
    before = plain.algorithm.models.clone()
    plain.run_round(1), stepped.run_round(1)
    assert torch.allclose(stepped.algorithm.models, before + 0.5 * (plain.algorithm.models - before), atol=1e-6)
