"""Availability patterns hit their stated online share over many rounds and clients; traces in fedlight's and
FedScale's fields are read as stated, and a bad setting or trace is refused in one line naming the setting."""

import json
import pickle

import numpy as np
import pytest

from fedlight.system.availability import Diurnal, FixedShare, Periods, Trace
from fedlight.system.config import SystemConfig
from fedlight.system.system_model import SystemModel
from fedlight.system.traces import device_speeds


def test_a_fixed_share_puts_that_share_online_every_round_a_different_one_each_round():
    pattern = FixedShare(0.3, 20, seed=0)
    rounds = np.stack([pattern.online(r, 0.0) for r in range(1, 201)])
    assert (rounds.sum(axis=1) == 6).all()
    assert len({tuple(np.flatnonzero(r)) for r in rounds}) > 150
    assert rounds.mean(axis=0) == pytest.approx(np.full(20, 0.3), abs=0.12)  # every client its turn
    assert (FixedShare(0.3, 20, seed=0).online(7, 0.0) == rounds[6]).all()


def test_on_off_periods_keep_the_online_share_of_the_time_over_many_rounds():
    pattern = Periods(online_s=3600.0, offline_s=3 * 3600.0, count=200, seed=0)  # online a quarter of the time
    times = np.arange(500) * 997.0  # rounds of about 17 virtual minutes
    share = np.mean([pattern.online(r, t).mean() for r, t in enumerate(times)])
    assert share == pytest.approx(0.25, abs=0.03)
    one = np.array([pattern.online(0, t)[0] for t in np.arange(0, 4 * 3600, 60.0)])  # one client over one cycle
    assert one.mean() == pytest.approx(0.25, abs=1 / 240)


def test_diurnal_availability_keeps_each_client_online_its_local_window_and_the_window_share_overall():
    pattern = Diurnal((22.0, 6.0), start_hour=0.0, count=240, seed=0)  # 8 hours a day online
    days = np.arange(0, 3 * 86400, 1800.0)
    online = np.stack([pattern.online(0, t) for t in days])
    assert online.mean() == pytest.approx(8 / 24, abs=0.02)
    zone = int(pattern.zone[0])
    local_hours = (days / 3600 + zone) % 24
    assert (online[:, 0] == ((local_hours >= 22) | (local_hours < 6))).all()


def test_a_trace_of_online_intervals_repeats_every_finish_time_ends_included(tmp_path):
    trace = {
        "1": {"active": [10, 50], "inactive": [20, 60], "finish_time": 100},
        "2": {"active": [0], "inactive": [5], "finish_time": 10},
    }  # FedScale's keys from 1
    path = tmp_path / "behaviour.json"
    path.write_text(json.dumps(trace))
    pattern = Trace(str(path), 2)
    assert [pattern.online(0, t).tolist() for t in (10.0, 25.0, 160.0, 7.0, 118.0)] == [
        [True, True],
        [False, True],
        [True, True],
        [False, False],
        [True, False],
    ]


def test_device_traces_take_fedlight_fields_or_fedscales_device_profiles(tmp_path):
    path = tmp_path / "devices.pkl"  # FedScale ships its profiles as a pickle keyed from 1
    with path.open("wb") as f:
        pickle.dump(
            {1: {"computation": 10.0, "communication": 2000.0}, 2: {"samples_per_s": 50.0, "link_mbps": 4.0}}, f
        )
    compute, link = device_speeds(str(path), 2)
    # 10 ms of inference a sample is 30 ms of training (forward and backward): 33.3 samples a second
    assert compute.tolist() == pytest.approx([1000 / 30, 50.0]) and link.tolist() == [2.0, 4.0]


@pytest.mark.parametrize(
    "records, message",
    [
        (
            {"0": {"samples_per_s": 1.0, "link_mbps": 1.0}, "1": {"samples_per_s": 1.0, "link_mbps": 1.0}},
            "none for client 2 (key 2) of the 3 clients: give one record per client, keyed 0..2",
        ),
        (
            [{"samples_per_s": 1.0, "link_mbps": 1.0}] * 2 + [{"samples_per_s": 1.0}],
            "the record of client 2 has no 'link_mbps' or 'communication': give it to every client",
        ),
        ([{"samples_per_s": 1.0, "link_mbps": 0}] * 3, "client 0's link_mbps / communication is 0: give a positive"),
    ],
)
def test_a_device_trace_with_a_missing_client_or_field_is_refused_in_one_line(tmp_path, records, message):
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match="^system.device_trace: ") as error:
        device_speeds(str(path), 3)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"availability": "share", "online_share": 0.0}, "system.online_share is 0.0: no client would ever be online"),
        ({"availability": "diurnal", "online_hours": (8.0, 8.0)}, "system.online_hours is [8.0, 8.0], an empty window"),
        ({"deadline_s": 1.0, "deadline_percentile": 50.0}, "give one"),
        ({"selection": "power_of_chioce"}, "did you mean 'power_of_choice'"),
        ({"dropout": 1.0}, "system.dropout must be in [0, 1)"),
    ],
)
def test_bad_system_settings_are_refused_in_one_line_naming_the_setting(settings, message):
    with pytest.raises(ValueError) as error:
        SystemConfig(**settings)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_deadline_no_client_can_meet_is_refused_with_the_time_the_fastest_needs():
    model = SystemModel(SystemConfig(deadline_s=1.0), num_clients=2, seed=0)
    model.steps, model.compute_s, model.transfer_s = np.array([4, 2]), np.array([4.0, 3.0]), np.array([0.5, 0.25])
    with pytest.raises(
        ValueError,
        match=r"^system.deadline_s is 1 s, but the fastest client needs 3.25 s for its "
        r"local work and its transfers: raise it above 3.25 s, or let stragglers",
    ):
        model.check_deadline()
    model.config = SystemConfig(deadline_s=1.0, partial_work=True)  # one step: 1 + 0.5 and 1.5 + 0.25 s
    with pytest.raises(ValueError, match=r"needs 1.5 s for one local step and its transfers: raise it above 1.5 s$"):
        model.check_deadline()
    model.config = SystemConfig(deadline_s=1.5, partial_work=True)
    model.check_deadline()
