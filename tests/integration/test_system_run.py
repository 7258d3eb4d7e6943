"""Runs with a `system:` section: without one a run draws and trains exactly as before (a neutral section changes
no number), a round's virtual time is its slowest client's, a client cut short trains exactly its share of the
steps, dropped clients are left out untrained, and a resumed run ends as an uninterrupted one."""

import copy

import numpy as np
import pytest
import torch

from fedlight.algorithms.fedavg import FedAvg
from fedlight.plugin.server import stream_seed
from fedlight.system.config import SpeedDistribution, SystemConfig

from helpers.federations import small_federation

SLOW_AND_FLAKY = SystemConfig(
    compute=SpeedDistribution(100.0, "slow_share", slow_share=0.5, slow_factor=4.0),
    availability="periods",
    online_s=3.0,
    offline_s=1.0,
    deadline_s=5.0,
    partial_work=True,
    dropout=0.34,
    selection="power_of_choice",
)


def federation(system: SystemConfig | None, rounds: int, local_epochs: int = 2):
    """6 digits clients, 3 a round, FedAvg, evaluated after the last round."""
    return small_federation(
        FedAvg(),
        num_clients=6,
        rounds=rounds,
        clients_per_round=3,
        local_epochs=local_epochs,
        eval_every=rounds,
        system=system,
    )


def run(system: SystemConfig | None, rounds: int):
    """The federation, 2 local epochs, and its rounds' results."""
    fed = federation(system, rounds)
    return fed, [fed.run_round(t) for t in range(1, rounds + 1)]


@pytest.fixture(scope="module")
def plain_and_neutral():
    return run(None, 2), run(SystemConfig(), 2)


def test_without_a_system_section_nothing_changes_and_a_neutral_one_changes_no_number(plain_and_neutral):
    (plain, plain_rounds), (neutral, neutral_rounds) = plain_and_neutral
    assert torch.equal(plain.algorithm.models, neutral.algorithm.models)
    for a, b in zip(plain_rounds, neutral_rounds):
        assert a.training == b.training and a.evaluation == b.evaluation and a.left_out == b.left_out == []
        assert not any(name.startswith("system/") for name in a.scalars)
    for fed in (plain, neutral):  # the base class's uniform draw from the (seed, round) stream
        drawn = np.random.default_rng(stream_seed(0, 3, "select")).choice(6, size=3, replace=False)
        assert fed.algorithm.select_clients(3) == sorted(drawn.tolist())


def test_a_rounds_virtual_time_is_its_slowest_clients_local_work_and_two_transfers(plain_and_neutral):
    _, (neutral, rounds) = plain_and_neutral
    sizes = neutral.server.clients.train_sizes.tolist()
    bits = neutral.flat.numel * 32  # float32 entries, down and up at 10 Mbit/s
    total = 0.0
    for result in rounds:
        clients = np.random.default_rng(stream_seed(0, result.round, "select")).choice(6, size=3, replace=False)
        slowest = max(-(-sizes[c] // 32) * 2 * 32 / 100.0 + 2 * bits / 10e6 for c in clients)  # 100 samples/s
        total += slowest
        assert result.scalars["system/round_virtual_s"] == pytest.approx(slowest, rel=1e-12)
        assert result.scalars["system/virtual_time_s"] == pytest.approx(total, rel=1e-12)


def test_a_client_cut_to_half_its_steps_trains_its_first_epoch_of_two_the_others_unchanged(plain_and_neutral):
    _, (fed, _) = plain_and_neutral
    whole = fed.execution.train(3, [0, 1, 2])
    with fed.execution.trainer.work_shares.during({1: 0.5}):
        cut = fed.execution.train(3, [0, 1, 2])
    one_epoch = fed.server.clients.train(3, 1, fed.algorithm.client_model(1), epochs=1).params
    assert torch.equal(cut.params[0], whole.params[0]) and torch.equal(cut.params[2], whole.params[2])
    assert torch.equal(cut.params[1], one_epoch) and not torch.equal(cut.params[1], whole.params[1])
    with fed.execution.trainer.work_shares.during({1: 0.5}):  # custom group loops take the same share
        steps = [(s.epoch, s.step) for s in fed.server.clients.group_batches(3, [0, 1, 2]) if 1 in s.rows]
    assert steps == [(0, step) for step in range(fed.server.clients.local_steps(1, epochs=1))]


def test_dropped_clients_are_left_out_untrained_and_a_resumed_run_ends_as_an_uninterrupted_one():
    whole = federation(SLOW_AND_FLAKY, 3, local_epochs=1)
    rounds = [whole.run_round(1), whole.run_round(2)]
    saved = copy.deepcopy(whole.state_dict())  # the checkpoint after round 2
    rounds.append(whole.run_round(3))
    for result in rounds:
        s = result.scalars
        assert set(result.dropped) <= set(result.left_out) and len(result.left_out) == len(result.dropped)
        assert (
            len(result.dropped)
            == s["system/dropped_offline"]
            + s["system/dropped_out"]
            + s["system/dropped_deadline"]
            + s["system/went_offline"]
        )
    assert np.isnan(rounds[-1].per_client["train/loss"][rounds[-1].dropped]).all()
    assert sum(len(r.dropped) for r in rounds) > 0 and sum(r.scalars["system/partial"] for r in rounds) > 0
    resumed = federation(SLOW_AND_FLAKY, 3, local_epochs=1)  # a fresh run of the same seed, from the checkpoint
    resumed.load_state_dict(saved)
    last = resumed.run_round(3)
    assert last.scalars == rounds[2].scalars and last.dropped == rounds[2].dropped
    assert torch.equal(resumed.algorithm.models, whole.algorithm.models)
