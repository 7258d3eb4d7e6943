"""The virtual clock of a synchronous round, worked by hand: each client's compute and transfer time, the round's
length, who a deadline drops or cuts short, dropouts, and a round that would end empty."""

import numpy as np
import pytest

from fedlight.system.clock import DeviceProfiles, VirtualClock
from fedlight.system.config import SpeedDistribution
from fedlight.system.speeds import draw_speeds
from fedlight.system.stragglers import finished_steps, round_deadline, run_round

NOBODY_OUT = np.zeros(4, dtype=bool)


def test_a_round_lasts_as_long_as_its_slowest_client_worked_by_hand_for_three_clients():
    # 4, 2 and 3 steps of 16 samples at 64, 32 and 16 samples a second: 1 s, 1 s and 3 s of compute; a model of
    # 1 Mbit down and up over 8, 4 and 2 Mbit/s: 0.25 s, 0.5 s and 1 s of transfers
    devices = DeviceProfiles(np.array([64.0, 32.0, 16.0]), np.array([8.0, 4.0, 2.0]))
    steps = np.array([4, 2, 3])
    compute, transfer = devices.compute_s(steps, 16), devices.transfer_s(1e6)
    assert compute.tolist() == [1.0, 1.0, 3.0] and transfer.tolist() == [0.25, 0.5, 1.0]
    times = run_round(steps, compute, transfer, np.zeros(3, dtype=bool), None, partial=False)
    assert times.duration_s == 4.0 and times.kept.all() and times.done.tolist() == [4, 2, 3]
    clock = VirtualClock()
    clock.advance(times.duration_s)
    clock.advance(1.5)
    assert clock.now_s == 5.5


def four_clients():
    """Times 1.5, 2.5, 3.5 and 4.5 s: 4 steps each of 0.25, 0.5, 0.75 and 1 s, and 0.5 s of transfers."""
    return np.array([4, 4, 4, 4]), np.array([1.0, 2.0, 3.0, 4.0]), np.full(4, 0.5)


def test_the_deadline_drops_exactly_the_clients_whose_work_and_transfers_take_longer():
    steps, compute, transfer = four_clients()
    times = run_round(steps, compute, transfer, NOBODY_OUT, 2.6, partial=False)
    assert times.kept.tolist() == [True, True, False, False]
    assert times.cut.tolist() == [False, False, True, True]
    assert times.duration_s == 2.6  # the server waits until the deadline to know who missed it
    on_time = run_round(steps, compute, transfer, NOBODY_OUT, 2.5, partial=False)  # exactly on time is in time
    assert on_time.kept.tolist() == [True, True, False, False] and on_time.duration_s == 2.5


def test_with_partial_work_a_straggler_sends_the_whole_steps_that_fit_beside_its_transfers():
    steps, compute, transfer = four_clients()
    # (2.6 - 0.5) s leave room for 2.1 / 0.75 = 2.8 steps of client 2 and 2.1 / 1 = 2.1 of client 3
    times = run_round(steps, compute, transfer, NOBODY_OUT, 2.6, partial=True)
    assert times.done.tolist() == [4, 4, 2, 2] and times.kept.all()
    assert times.cut.tolist() == [False, False, True, True]
    assert times.duration_s == 2.6
    # a step that does not fit beside the transfers leaves nothing to send
    assert finished_steps(steps, compute, transfer, 1.2, partial=True).tolist() == [2, 1, 0, 0]


def test_a_percentile_deadline_is_that_percentile_of_the_selected_clients_times():
    steps, compute, transfer = four_clients()
    deadline = round_deadline(compute + transfer, None, 50)
    assert deadline == 3.0  # halfway between 2.5 and 3.5
    assert run_round(steps, compute, transfer, NOBODY_OUT, deadline, partial=False).kept.tolist() == [
        True,
        True,
        False,
        False,
    ]
    assert round_deadline(compute + transfer, 2.0, None) == 2.0 and round_deadline(compute, None, None) is None


def test_dropouts_send_nothing_and_a_round_the_deadline_would_empty_waits_for_the_first_client():
    steps, compute, transfer = four_clients()
    out = np.array([True, False, False, False])
    times = run_round(steps, compute, transfer, out, None, partial=False)
    assert times.kept.tolist() == [False, True, True, True] and times.duration_s == 4.5
    late = run_round(steps, compute, transfer, out, 1.0, partial=False)  # no one left meets 1 s
    assert late.waited and late.kept.tolist() == [False, True, False, False] and late.duration_s == 2.5


def test_a_slow_share_makes_exactly_that_share_of_clients_that_many_times_slower_reproducibly():
    slow = SpeedDistribution(100.0, "slow_share", slow_share=0.3, slow_factor=5.0)
    speeds = draw_speeds(slow, 20, seed=0, purpose="compute")
    assert sorted(set(speeds.tolist())) == [20.0, 100.0] and (speeds == 20.0).sum() == 6
    assert (draw_speeds(slow, 20, 0, "compute") == speeds).all()
    assert not (draw_speeds(slow, 20, 1, "compute") == speeds).all()
    # a client's speed does not depend on how many clients there are
    assert (
        draw_speeds(SpeedDistribution(2.0, "lognormal", sigma=0.5), 30, 0, "link")[:10]
        == draw_speeds(SpeedDistribution(2.0, "lognormal", sigma=0.5), 10, 0, "link")
    ).all()
    assert np.median(draw_speeds(SpeedDistribution(2.0, "lognormal", sigma=0.5), 401, 0, "link")) == pytest.approx(
        2.0, rel=0.1
    )
