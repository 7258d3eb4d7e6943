"""FedBuff (`system.buffer_size`) with algorithms that keep per-client state, nothing declared: with
K = C = the cohort it is the synchronous run bit for bit; a slow client's state changes only when it arrives, and is
then what it trained (compared with a synchronous round that trained it from the same model); a stale client's
personal entries (`Algorithm.personal_mask`) arrive exactly as trained while its shared ones are re-based and
weighted by staleness, worked by hand; a method for which asynchronous rounds are wrong is refused in one line naming
it and why; and a run resumed with state in flight ends as an uninterrupted one."""

import copy
import re

import numpy as np
import pytest
import torch

from fedlight.algorithms.cflgp import CFLGP
from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedpac import FedPAC
from fedlight.algorithms.fedper import FedPer
from fedlight.algorithms.fedrep import FedRep
from fedlight.algorithms.fedsoft import FedSoft
from fedlight.algorithms.local import Local
from fedlight.algorithms.scaffold import SCAFFOLD
from fedlight.plugin import Algorithm
from fedlight.plugin.updates import Updates
from fedlight.system.buffered import InFlight, take_arrivals
from fedlight.system.config import SystemConfig
from fedlight.system.system_model import SystemModel

from helpers.federations import every_row, small_federation
from helpers.system_times import hand_set_times

STORE = {
    Ditto: "personal",
    Local: "local_models",
    FedSoft: "local_models",
    SCAFFOLD: "client_controls",
    "KeepsRows": "kept",
}


def store_name(federation) -> str:
    """The client state an algorithm keeps: its own store, or its personal part's."""
    algorithm = federation.algorithm
    kind = type(algorithm)
    return STORE.get(kind, STORE.get(kind.__name__)) or algorithm.personal.name


def rows(federation, name: str) -> torch.Tensor:
    """Every client's row of the client state `name`."""
    return every_row(federation.client_states.stores[name])


class KeepsRows(Algorithm):
    """A plugin that keeps each client's trained model as its state and declares nothing about asynchronous rounds."""

    def setup(self, server) -> None:
        super().setup(server)
        self.kept = server.state.declare("kept", initial=server.model.initial_params)

    def train_group(self, round, clients, starts):
        trained = super().train_group(round, clients, starts)
        trained.state = {**trained.state, "kept": trained.params.clone()}
        return trained


@pytest.mark.parametrize(
    "make, per_round",
    [
        (lambda: Ditto(lam=0.5), 3),
        (lambda: FedSoft(num_clusters=2, selection_size=2), None),  # its own draws: the union of each center's two
        (FedPer, 3),
        (lambda: FedRep(head_epochs=1), 3),  # its own two-phase train_group
        (SCAFFOLD, 3),  # its clients' control variates, returned and summed into c
        (KeepsRows, 3),  # a plugin's per-client state, with nothing declared
    ],
)
def test_a_buffer_of_the_whole_cohort_is_the_synchronous_run_bit_for_bit(make, per_round):
    runs = []
    for system in (SystemConfig(), SystemConfig(buffer_size=6 if per_round is None else per_round)):
        fed = small_federation(make(), rounds=2, clients_per_round=per_round, eval_every=2, system=system)
        runs.append((fed, [fed.run_round(t) for t in (1, 2)]))
    (sync, sync_rounds), (buffered, buffered_rounds) = runs
    assert torch.equal(sync.algorithm.models, buffered.algorithm.models)
    name = store_name(sync)
    assert torch.equal(rows(sync, name), rows(buffered, name))
    assert sync.client_states.stores[name].touched().tolist() == buffered.client_states.stores[name].touched().tolist()
    for a, b in zip(sync_rounds, buffered_rounds):
        assert a.training == b.training and a.evaluation == b.evaluation
        assert b.scalars["system/staleness_mean"] == 0.0 and b.scalars["system/in_flight"] == 0


@pytest.mark.parametrize("make", [lambda: Ditto(lam=0.5), Local])
def test_a_slow_clients_state_changes_only_at_its_arrival_and_is_then_what_it_trained(make):
    """Three clients, 3 s, 1 s and 2 s a round, all sent out in round 1, one arrival an update: client 2 arrives in
    round 2 and client 0 in round 4 (3 versions stale, weight 1/2), each with what it trained in round 1 from the
    initial models, as a synchronous round 1 trains it. Local's model arrives as trained, not re-based."""
    reference = small_federation(make(), num_clients=3, rounds=1, clients_per_round=3, system=SystemConfig())
    reference.run_round(1)
    name = store_name(reference)
    trained = rows(reference, name)
    fed = small_federation(
        make(),
        num_clients=3,
        rounds=4,
        clients_per_round=3,
        eval_every=4,
        system=SystemConfig(buffer_size=1, concurrency=3),
    )
    model = fed.extension(SystemModel)
    hand_set_times(model, np.array([3.0, 1.0, 2.0]), np.zeros(3))
    initial = rows(fed, name)[0].clone()  # every client's row before it trains: the initial model
    store = fed.client_states.stores[name]
    for t in (1, 2, 3):
        fed.run_round(t)
        assert 0 not in store.touched().tolist() and torch.equal(store[0], initial)
        if t == 2:
            assert torch.equal(store[2], trained[2])
    scalars = fed.run_round(4).scalars
    assert scalars["system/staleness_max"] == 3.0
    assert torch.equal(store[0], trained[0])


def test_an_entry_that_did_not_move_while_in_flight_arrives_as_trained_one_that_moved_re_based():
    """Client 0 trained [1, 1] -> [3, -3] from version 0; at version 3 (tau 3, weight 1/2) the model it would receive
    is [10, 1]: entry 0 moved (shared, others' arrivals changed it), entry 1 did not (its personal entry, which only
    its own arrival writes). Entry 0: 10 + 1/2 x (3 - 1) = 11; entry 1: -3, as trained (not 1 + 1/2 x (-3 - 1) = -1).
    Client 1, fresh (tau 0), arrives exactly as trained. Nothing says which entry is personal."""
    current = {0: torch.tensor([10.0, 1.0]), 1: torch.tensor([10.0, 5.0])}
    waiting = InFlight(
        np.array([0]),
        np.array([0]),
        np.array([2.0]),
        torch.tensor([[3.0, -3.0]]),
        torch.tensor([[1.0, 1.0]]),
        torch.tensor([0.5]),
    )
    fresh = Updates(
        torch.tensor([1]),
        torch.tensor([[7.1, 8.3]]),
        torch.tensor([[10.0, 5.0]]),
        torch.tensor([9.0]),
        torch.tensor([0.75]),
    )
    arrived, left = take_arrivals(
        waiting, fresh, np.array([1.0]), 3, 2, "polynomial", current.__getitem__, torch.tensor([4.0, 9.0])
    )
    assert arrived.updates.clients.tolist() == [0, 1] and arrived.staleness.tolist() == [3, 0] and len(left) == 0
    assert arrived.updates.params[0].tolist() == [11.0, -3.0]
    assert torch.equal(arrived.updates.params[1], torch.tensor([7.1, 8.3]))  # fresh: exactly as trained
    assert torch.equal(arrived.updates.starts, torch.tensor([[10.0, 1.0], [10.0, 5.0]]))
    moved = {0: torch.tensor([10.0, 7.0]), 1: current[1]}  # had entry 1 moved, it would be re-based too
    arrived, _ = take_arrivals(
        waiting, fresh, np.array([1.0]), 3, 2, "polynomial", moved.__getitem__, torch.tensor([4.0, 9.0])
    )
    assert arrived.updates.params[0].tolist() == [11.0, 5.0]


def client_0_sent_out_in_round_1(algorithm):
    """A federation of three clients, 3 s, 1 s and 2 s a round, one arrival an update, after round 1: (it, what
    client 0 trained in round 1, the model it trained from); client 0 arrives in round 4, 3 versions stale."""
    fed = small_federation(
        algorithm,
        num_clients=3,
        rounds=4,
        clients_per_round=3,
        eval_every=4,
        system=SystemConfig(buffer_size=1, concurrency=3),
    )
    model = fed.extension(SystemModel)
    hand_set_times(model, np.array([3.0, 1.0, 2.0]), np.zeros(3))
    fed.run_round(1)
    row = model.in_flight.clients.tolist().index(0)
    return fed, model.in_flight.trained[row].clone(), model.in_flight.starts[row].clone()


def test_a_slow_fedper_clients_head_arrives_as_trained_and_its_base_moves_the_model_by_half_its_change():
    """Three clients, 3 s, 1 s and 2 s a round, one arrival an update: client 0, sent out in round 1, arrives in
    round 4, 3 versions stale. Its personal layers are stored exactly as it trained them; the base, FedAvg of its
    update alone, becomes the base before round 4 plus 1/sqrt(1 + 3) = 1/2 of its change."""
    fed, trained, start = client_0_sent_out_in_round_1(FedPer())
    per = fed.algorithm
    fed.run_round(2)
    fed.run_round(3)
    head, base = per.personal_mask, ~per.personal_mask
    assert torch.equal(per.personal[0], start[head])  # not written while in flight
    before = per.models[0].clone()
    assert fed.run_round(4).scalars["system/staleness_max"] == 3.0
    assert torch.equal(per.personal[0], trained[head])
    expected = before[base] + 0.5 * (trained[base] - start[base])
    assert torch.allclose(per.models[0][base], expected, rtol=0, atol=1e-6)
    assert not torch.allclose(per.models[0][base], trained[base], rtol=0, atol=1e-4)  # not taken as trained


def test_a_fedsoft_center_averages_the_arrived_local_models_it_drew_when_they_were_sent_out():
    """Four clients, 3, 1, 2 and 1.5 s a round, one arrival an update; importance weights estimated once (round 1),
    so each round's draws can be recomputed. A center becomes the arrived local model when it drew that client in the
    round the client was sent out in, and is unchanged otherwise; in some round that differs from the arrival round's
    draws."""
    fed = small_federation(
        FedSoft(num_clusters=2, selection_size=2, estimation_interval=100),
        num_clients=4,
        rounds=6,
        eval_every=6,
        system=SystemConfig(buffer_size=1),
    )
    model, soft = fed.extension(SystemModel), fed.algorithm
    hand_set_times(model, np.array([3.0, 1.0, 2.0, 1.5]), np.zeros(4))
    differs = False
    for t in range(1, 7):
        sent_in = {c: v + 1 for c, v in zip(model.in_flight.clients.tolist(), model.in_flight.versions.tolist())}
        centers = soft.models.clone()
        fed.run_round(t)
        (arrived,) = (set(sent_in) | set(soft.select_clients(t))) - set(model.in_flight.clients.tolist())
        drawn = [arrived in draw for draw in soft.draws(sent_in.get(arrived, t))]
        for s, drew in enumerate(drawn):
            expected = soft.local_models[arrived] if drew else centers[s]
            assert torch.equal(soft.models[s], expected)
        differs |= drawn != [arrived in draw for draw in soft.draws(t)]
    assert differs


@pytest.mark.parametrize(
    "algorithm, message",
    [
        (CFLGP, "CFLGP's clients send 'criterion_update' (a value the server reads client by client) beside the model"),
        (FedPAC, "FedPAC's clients send 'fedpac_bias' (a value the server reads client by client) beside the model"),
    ],
)
def test_a_method_asynchronous_rounds_are_wrong_for_is_refused_in_one_line_naming_it_and_why(algorithm, message):
    with pytest.raises(ValueError, match=re.escape(f"system.buffer_size: {message}")) as error:
        small_federation(algorithm(), rounds=1, clients_per_round=3, system=SystemConfig(buffer_size=2)).run_round(1)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("make", [lambda: Ditto(lam=0.5), Local])
def test_a_run_resumed_with_state_in_flight_ends_as_an_uninterrupted_one(make):
    system = SystemConfig(buffer_size=2, concurrency=4)
    whole = small_federation(make(), rounds=3, clients_per_round=3, eval_every=3, system=system)
    rounds = [whole.run_round(1), whole.run_round(2)]
    saved = copy.deepcopy(whole.state_dict())
    assert len(whole.extension(SystemModel).in_flight) == 2
    rounds.append(whole.run_round(3))
    assert any(r.scalars["system/staleness_mean"] > 0 for r in rounds)
    resumed = small_federation(make(), rounds=3, clients_per_round=3, eval_every=3, system=system)
    resumed.load_state_dict(saved)
    last = resumed.run_round(3)
    assert last.scalars == rounds[2].scalars and last.training == rounds[2].training
    assert last.evaluation == rounds[2].evaluation
    assert torch.equal(resumed.algorithm.models, whole.algorithm.models)
    name = store_name(whole)
    assert torch.equal(rows(resumed, name), rows(whole, name))


def test_a_stale_scaffold_client_stores_the_variate_it_computed_from_the_model_it_was_sent():
    """Three clients, 3 s, 1 s and 2 s a round, one arrival an update: client 0, sent out in round 1 from x0 with
    c = c_0 = 0, arrives in round 4; its stored c_0+ is (x0 - y0) / (K eta) from its own trained y0 (option II, as
    the client computes it), not from the x the server holds by then, and c moves by c_0+ / N."""
    fed, trained, start = client_0_sent_out_in_round_1(SCAFFOLD())
    alg, x0, y0 = fed.algorithm, start.double(), trained.double()
    for t in (2, 3):
        fed.run_round(t)
    control_before = alg.control.double().clone()
    assert not torch.equal(alg.models[0].double(), x0)  # the server model moved while client 0 was in flight
    fed.run_round(4)
    steps, rate = fed.server.clients.local_steps(0), fed.server.clients.learning_rate(1)
    expected = ((x0 - y0) / (steps * rate)) * alg.parameter_entries.double()
    assert torch.allclose(alg.client_controls[0].double(), expected, atol=1e-5)
    assert torch.allclose(alg.control.double(), control_before + expected / 3, atol=1e-5)
