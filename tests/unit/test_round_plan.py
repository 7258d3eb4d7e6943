"""The round's plan and its updates value: declared at set-up, streamed or held, left-out clients handed to the
hooks, FedAvg's own aggregate run by the engine, and what hooks log landing in the round's result only."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedlight import Algorithm, RoundUpdates
from fedlight.plugin import Plan
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.ocfl import OCFL
from fedlight.run.cli import main

from helpers.federations import small_federation


def test_a_hook_that_runs_only_when_declared_is_refused_without_its_declaration():
    with pytest.raises(TypeError, match=r"write plan = Plan\(own_training=True\)"):

        class OwnWork(Algorithm):  # noqa: F841
            def train_client(self, round, client, start):
                return start, torch.zeros(())

    with pytest.raises(TypeError, match=r"write plan = Plan\(corrects_gradient=True\)"):

        class Corrects(Algorithm):  # noqa: F841
            def local_gradient(self, client, params, grad, start):
                grad.zero_()

    with pytest.raises(TypeError, match=r"sets `holds_updates = True`.*write plan = Plan\(holds_updates=True\)"):

        class Old(Algorithm):  # noqa: F841
            holds_updates = True

    with pytest.raises(TypeError, match="overrides train_group but its plan declares own_training"):

        class Both(Algorithm):  # noqa: F841
            plan = Plan(own_training=True)

            def train_group(self, round, clients, starts):
                return super().train_group(round, clients, starts)

    assert FedAvg.plan == Plan() and OCFL.plan == Plan(holds_updates=True)

    class Declared(Algorithm):
        plan = Plan(own_training=True)

        def train_client(self, round, client, start):
            return start + 1, torch.zeros(())

    fed = small_federation(Declared(), num_clients=3, vectorize=-1)
    assert fed.execution.plan.trainer == "sequential" and "train_client" in fed.execution.plan.reason
    fed.run_round(1)
    assert torch.equal(fed.algorithm.models[0], fed.server.model.initial_params + 1)  # the mean of every start + 1


def test_the_plan_follows_the_declarations():
    fedavg, ocfl = small_federation(FedAvg(), num_clients=2), small_federation(OCFL(), num_clients=2)
    assert fedavg.execution.plan.updates == "stream" and ocfl.execution.plan.updates == "hold"
    assert fedavg.execution.plan.trainer == "sequential" and fedavg.execution.plan.reason == "federation.vectorize is 0"
    assert "streamed" in fedavg.execution.plan.describe() and "held" in ocfl.execution.plan.describe()


class Spy(FedAvg):
    """FedAvg that records how often its own aggregate ran and what each round's value held."""

    def __init__(self) -> None:
        super().__init__()
        self.aggregated: list[int] = []

    def aggregate(self, round, updates):
        self.aggregated.append(round)
        super().aggregate(round, updates)


def test_the_engine_always_calls_aggregate_so_fedavgs_own_code_runs():
    fed = small_federation(Spy(), num_clients=3, rounds=2)
    fed.run_round(1), fed.run_round(2)
    assert fed.algorithm.aggregated == [1, 2]


def test_a_streamed_round_is_read_once_and_never_held_whole():
    fed = small_federation(FedAvg(), num_clients=4, vectorize=2)
    updates = fed.execution.round_updates(1, [0, 1, 2, 3])
    assert [g.clients.tolist() for g in updates.groups()] == [[0, 1], [2, 3]]
    with pytest.raises(RuntimeError, match="read once"):
        next(updates.groups())
    with pytest.raises(RuntimeError, match=r"Plan\(holds_updates=True\)"):
        updates.all()


def test_a_held_round_is_every_update_in_client_order_and_groups_give_the_same():
    fed = small_federation(OCFL(), num_clients=4)
    updates = fed.execution.round_updates(1, [0, 2, 3])
    whole = updates.all()
    assert whole.clients.tolist() == [0, 2, 3] and updates.all() is whole
    assert [g.clients.tolist() for g in updates.groups()] == [[0, 2, 3]]
    report = updates.finish()
    assert report.left_out == [] and report.metrics["train/loss"] == pytest.approx(float(whole.train_loss.mean()))


class SeesLeftOut(FedAvg):
    plan = Plan(holds_updates=True)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[int]] = []

    def aggregate(self, round, updates):
        self.seen.append(list(updates.left_out))
        assert 2 not in updates.all().clients.tolist()
        super().aggregate(round, updates)


def test_the_aggregation_hooks_receive_the_clients_left_out():
    fed = small_federation(SeesLeftOut(), num_clients=4)
    fed.data.train.x[fed.data.train.bounds[2], 0, 3, 3] = float("nan")  # one pixel of client 2
    result = fed.run_round(1)
    assert fed.algorithm.seen == [[2]] and result.left_out == [2] and result.scalars["clients_left_out"] == 1


class Logs(FedAvg):
    plan = Plan(holds_updates=True)

    def pre_aggregation(self, round, updates):
        deltas = updates.all().deltas
        self.log("spy/mean_norm", deltas.norm(dim=1).mean())
        if round == 1:
            self.log_matrix("spy_gram", deltas @ deltas.T)


def test_what_hooks_log_belongs_to_the_round_it_was_logged_in():
    fed = small_federation(Logs(), num_clients=3, rounds=2)
    first = fed.run_round(1)
    second = fed.run_round(2)
    # the logged norm is the mean update norm, recomputed by hand from the round's own updates
    assert isinstance(first.scalars["spy/mean_norm"], float) and first.scalars["spy/mean_norm"] > 0
    assert first.matrices["spy_gram"].shape == (3, 3)
    assert np.allclose(first.matrices["spy_gram"], first.matrices["spy_gram"].T)
    assert "spy_gram" not in second.matrices and "spy/mean_norm" in second.scalars
    assert list(first.scalars)[:3] == ["round", "clients_trained", "clients_left_out"]


def test_held_round_of_given_updates_runs_the_hooks_directly():
    fed = small_federation(FedAvg(), num_clients=3)
    d = fed.flat.numel
    params = torch.stack([torch.full((d,), 1.0), torch.full((d,), 3.0)])
    updates = RoundUpdates.of(fed.execution.train(1, [0, 1]))
    updates.all().params = params
    fed.algorithm.aggregate(1, updates)
    sizes = fed.server.clients.train_sizes[:2].double()
    expected = (sizes[0] * 1.0 + sizes[1] * 3.0) / sizes.sum()
    assert torch.allclose(
        fed.algorithm.models[0].double(), torch.full((d,), float(expected), dtype=torch.float64), atol=1e-6
    )


def test_the_plan_is_printed_at_the_start_and_recorded_in_summary_json(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--run_name", "streamed", "--federation.rounds", "1", "--algorithm", "fedavg"]) == 0
    assert main(tiny_run_args + ["--run_name", "held", "--federation.rounds", "1", "--algorithm", "ocfl"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("FedAvg, 6 clients: updates streamed") for line in lines)
    assert any(line.startswith("OCFL, 6 clients: every update held") for line in lines)
    streamed = json.loads((tmp_path / "streamed" / "summary.json").read_text())
    held = json.loads((tmp_path / "held" / "summary.json").read_text())
    threads = streamed["plan"].pop("threads")
    assert threads == torch.get_num_threads() and streamed["plan"].pop("threads_from")
    assert streamed["plan"] == {
        "updates": "stream",
        "trainer": "vectorized",
        "reason": None,
        "gradient_hook": False,
        "processes": 1,
        "hold_reason": None,
        "every_client": [],
    }
    assert held["plan"]["updates"] == "hold" and streamed["vectorized"] is True


class SendsItsId(FedAvg):
    """Own local work that sends a per-client value beside the model, as Ditto sends its personal model."""

    plan = Plan(own_training=True)

    def setup(self, server):
        super().setup(server)
        server.message.sends("id", "per_client")

    def train_client(self, round, client, start):
        return start, torch.zeros(()), {"id": torch.full((2,), float(client))}


def test_what_clients_send_beside_their_models_reaches_the_hooks_by_name():
    fed = small_federation(SendsItsId(), num_clients=5, vectorize=2)  # streamed in groups of 2
    updates = fed.execution.round_updates(1, [0, 2, 3, 4])
    for _ in updates.groups():
        pass
    clients, rows = updates.state("id")
    assert clients.tolist() == [0, 2, 3, 4] and rows.tolist() == [[c, c] for c in (0.0, 2.0, 3.0, 4.0)]


def test_clients_starting_from_one_model_share_one_copy_of_it_in_their_updates():
    from fedlight.engine.execution import stacked_starts

    models = torch.arange(12.0).reshape(3, 4)
    shared = stacked_starts([models[1], models[1], models[1]])
    assert shared.shape == (3, 4) and shared.stride(0) == 0 and torch.equal(shared, models[[1, 1, 1]])
    models[1] = -1.0  # the server moves on; the round's starts do not
    assert torch.equal(shared[2], torch.tensor([4.0, 5.0, 6.0, 7.0]))
    mixed = stacked_starts([models[0], models[2], models[0]])
    assert mixed.stride(0) == 4 and torch.equal(mixed, models[[0, 2, 0]])


def test_masked_deltas_are_the_changes_on_the_masked_entries_whatever_the_starts():
    from fedlight.engine.execution import stacked_starts
    from fedlight.plugin.updates import Updates

    params = torch.arange(12.0).reshape(3, 4)
    mask = torch.tensor([True, False, True, True])
    for starts in (stacked_starts([torch.ones(4)] * 3), torch.arange(12.0).flip(0).reshape(3, 4)):
        updates = Updates(torch.arange(3), params.clone(), starts, torch.ones(3), torch.zeros(3))
        expected = (params - starts)[:, mask]  # worked the plain way
        assert torch.equal(updates.masked_deltas(mask), expected)
        assert torch.equal(updates.params, params)  # the trained models are left as they were
    assert torch.equal(updates.masked_deltas(None), params - updates.starts)
