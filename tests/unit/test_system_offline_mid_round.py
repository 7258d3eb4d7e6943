"""A client whose online period ends before it finishes its work and transfers goes offline mid-round: it is dropped
as a deadline drop is (or with partial work sends the steps that fit before it leaves), worked by hand for three
clients; each availability pattern says how long a client stays online; and a run with every client always online
is unchanged."""

import json

import numpy as np
import pytest
import torch

from fedlight.system.availability import Always, Diurnal, Periods, Trace
from fedlight.system.config import SystemConfig
from fedlight.system.stragglers import run_round
from fedlight.system.system_model import SystemModel

from helpers.federations import small_federation
from helpers.system_times import hand_set_times

# three clients of 10 local steps: 1, 2 and 4 s of work, 0.5 s of transfers each
STEPS, COMPUTE, TRANSFER = np.array([10, 10, 10]), np.array([1.0, 2.0, 4.0]), np.array([0.5, 0.5, 0.5])
NONE_OUT = np.zeros(3, dtype=bool)


def test_a_client_going_offline_before_it_finishes_is_dropped_and_not_waited_for():
    """Client 1 needs 2.5 s and is online 2 s more: it sends nothing; the round ends when client 2 does, 4.5 s."""
    times = run_round(STEPS, COMPUTE, TRANSFER, NONE_OUT, None, False, np.array([np.inf, 2.0, 9.0]))
    assert times.done.tolist() == [10, 0, 10] and times.kept.tolist() == [True, False, True]
    assert times.went_offline.tolist() == [False, True, False] and times.duration_s == 4.5
    slowest_leaves = run_round(STEPS, COMPUTE, TRANSFER, NONE_OUT, None, False, np.array([np.inf, 9.0, 3.0]))
    assert slowest_leaves.kept.tolist() == [True, True, False] and slowest_leaves.duration_s == 2.5


def test_with_partial_work_it_sends_the_steps_that_fit_before_it_leaves():
    """Client 1's steps take 0.2 s each: (2 - 0.5) / 0.2 = 7.5, so 7 steps and its transfers, done at 1.9 s; the
    deadline of 5 s cuts no one, so the round lasts until client 2's 4.5 s. Client 0 online 0.55 s more fits no
    0.1 s step beside its 0.5 s of transfers: it goes offline with nothing sent."""
    times = run_round(STEPS, COMPUTE, TRANSFER, NONE_OUT, 5.0, True, np.array([np.inf, 2.0, 9.0]))
    assert times.done.tolist() == [10, 7, 10] and times.kept.all() and times.cut.tolist() == [False, True, False]
    assert not times.went_offline.any() and times.duration_s == 4.5
    too_soon = run_round(STEPS, COMPUTE, TRANSFER, NONE_OUT, None, True, np.array([0.55, 9.0, 9.0]))
    assert too_soon.went_offline.tolist() == [True, False, False] and too_soon.done.tolist() == [0, 10, 10]


def test_every_client_online_all_round_is_the_round_without_availability():
    for deadline, partial in ((None, False), (3.0, False), (3.0, True)):
        plain = run_round(STEPS, COMPUTE, TRANSFER, NONE_OUT, deadline, partial)
        always = run_round(STEPS, COMPUTE, TRANSFER, NONE_OUT, deadline, partial, Always(3).online_left_s(1, 0.0))
        for field in ("done", "dropped_out", "cut", "kept"):
            assert getattr(plain, field).tolist() == getattr(always, field).tolist()
        assert (plain.duration_s, plain.waited) == (always.duration_s, always.waited)
        assert not always.went_offline.any()


def test_each_pattern_says_how_long_its_clients_stay_online(tmp_path):
    periods = Periods(online_s=10.0, offline_s=20.0, count=3, seed=0)
    periods.phase_s = np.array([0.0, 5.0, 25.0])  # at 3 s: 3 and 8 s into their online 10 s, the third offline
    assert periods.online_left_s(1, 3.0).tolist() == [7.0, 2.0, 0.0]
    diurnal = Diurnal((22.0, 6.0), start_hour=0.0, count=2, seed=0)
    diurnal.zone = np.array([0.0, 10.0])  # at 1:30 UTC: local 1:30 (online until 6:00) and 11:30 (offline)
    assert diurnal.online_left_s(1, 5400.0).tolist() == [4.5 * 3600, 0.0]
    assert Diurnal((8.0, 8.0), 0.0, 2, 0).online_left_s(1, 0.0).tolist() == [np.inf, np.inf]
    path = tmp_path / "behaviour.json"
    path.write_text(json.dumps({"0": {"active": [10, 50], "inactive": [20, 60], "finish_time": 100}}))
    assert [Trace(str(path), 1).online_left_s(1, t).tolist() for t in (12.0, 30.0, 155.0)] == [[8.0], [0.0], [5.0]]


def test_in_a_run_the_leaving_client_is_left_out_untrained_and_counted():
    """Three clients online 10 s of every 30: client 1 is 8 s into its window at the round's start and its round
    takes 4 s, so it leaves; the others stay, and the round lasts until client 0's 3.5 s."""
    fed = small_federation(
        num_clients=3,
        rounds=1,
        clients_per_round=3,
        eval_every=1,
        system=SystemConfig(availability="periods", online_s=10.0, offline_s=20.0),
    )
    model = fed.extension(SystemModel)
    model.availability.phase_s = np.array([0.0, 8.0, 1.0])
    hand_set_times(model, np.array([3.0, 3.5, 2.0]), np.full(3, 0.5))
    before = fed.algorithm.models.clone()
    result = fed.run_round(1)
    assert result.scalars["system/went_offline"] == 1 and result.scalars["system/round_virtual_s"] == 3.5
    assert list(result.dropped) == [1]
    assert not torch.equal(fed.algorithm.models, before)


def test_under_fedbuff_a_dispatched_client_going_offline_never_flies():
    """The same three clients sent out at once, one arrival an update: client 1 leaves, client 2 (2.5 s) arrives,
    client 0 stays in flight."""
    fed = small_federation(
        num_clients=3,
        rounds=1,
        clients_per_round=3,
        eval_every=1,
        system=SystemConfig(availability="periods", online_s=10.0, offline_s=20.0, buffer_size=1),
    )
    model = fed.extension(SystemModel)
    model.availability.phase_s = np.array([0.0, 8.0, 1.0])
    hand_set_times(model, np.array([3.0, 3.5, 2.0]), np.full(3, 0.5))
    scalars = fed.run_round(1).scalars
    assert scalars["system/went_offline"] == 1 and scalars["system/virtual_time_s"] == 2.5
    assert model.in_flight.clients.tolist() == [0]


@pytest.mark.parametrize("availability", ["always", "share"])
def test_patterns_online_all_round_never_take_anyone_offline_mid_round(availability):
    fed = small_federation(
        num_clients=4,
        rounds=1,
        clients_per_round=2,
        eval_every=1,
        system=SystemConfig(availability=availability, online_share=0.5),
    )
    assert fed.run_round(1).scalars["system/went_offline"] == 0
