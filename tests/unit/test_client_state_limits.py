"""Where per-client state must fit (`fedlight.engine.state_limits`, `fedlight.engine.spill`): a memory budget below
one round's rows and a disk too small for the rows a run may spill are refused in one line with the numbers; a disk
that fills up while the spill file grows stops the run in one line with its last checkpoint intact, and the resumed
run ends with the numbers of an uninterrupted one."""

import csv
import math
import errno
import os

import pytest
import torch

from fedlight.algorithms.ditto import Ditto
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.ocfl import OCFL
from fedlight.engine import federation as federation_module
from fedlight.engine import state_limits
from fedlight.engine.federation import Federation
from fedlight.engine.state_limits import check_round_fits, disk_shortfall
from fedlight.models import SmallCNN
from fedlight.plugin.algorithm import Algorithm
from fedlight.engine.client_states import ClientStates
from fedlight.engine.spill import ClientStateDiskFull
from fedlight.run import checkpoint
from fedlight.run.cli import main

from helpers.federations import small_federation
from helpers.many_clients import ditto_run_args, row_bytes_of

CPU = torch.device("cpu")
ROW = 4 * 4  # bytes of a row of four float32
SMALL_CNN_ROW = row_bytes_of(SmallCNN(1, 10, 8, width=8))  # a client's model in the small federations: 15,272 bytes


def test_a_budget_must_hold_one_rounds_rows_over_every_store():
    states = ClientStates(CPU, 60)
    states.declare("local", 100, torch.zeros(4))  # 16 bytes a client
    states.declare("alpha", 100, torch.tensor(0.5))  # 4 bytes a client
    check_round_fits(states, 3)  # 3 x 20 = 60 bytes: exactly the budget
    with pytest.raises(ValueError) as refused:
        check_round_fits(states, 4)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("federation.client_state_memory is 6e-08 GB (60 bytes)")
    assert "20 bytes a client (local 16 + alpha 4) x 4 clients a round = 80 bytes" in message
    assert "raise federation.client_state_memory to at least 0.001 GB" in message
    with pytest.raises(ValueError, match="x round 7's 4 clients = 80 bytes"):
        check_round_fits(states, 4, round=7)
    check_round_fits(ClientStates(CPU, 0), 3400)  # no store: nothing to hold


def test_a_federation_whose_budget_is_below_a_rounds_rows_is_refused_at_set_up():
    with pytest.raises(ValueError) as refused:  # a share: half of 6 clients is 3 a round
        small_federation(Ditto(participation=0.5), num_clients=6, client_state_memory=2.5 * SMALL_CNN_ROW / 1e9)
    assert (
        f"{SMALL_CNN_ROW:,} bytes a client (personal {SMALL_CNN_ROW:,}) x 3 clients a round = "
        f"{3 * SMALL_CNN_ROW:,} bytes"
    ) in str(refused.value)
    fed = small_federation(Ditto(), num_clients=6, clients_per_round=2, client_state_memory=2.5 * SMALL_CNN_ROW / 1e9)
    assert fed.client_states.budget.limit >= 2 * SMALL_CNN_ROW


class EveryClientInRound2(Algorithm):
    """FedAvg with a per-client store, which trains every client in round 2 (as FL+HC's clustering round)."""

    def setup(self, server) -> None:
        super().setup(server)
        self.notes = server.state.declare("notes", initial=torch.zeros(1000))

    def select_clients(self, round: int) -> list[int]:
        return list(range(self.server.num_clients)) if round == 2 else super().select_clients(round)


def test_a_round_that_selects_more_clients_than_the_budget_holds_is_refused_before_it_trains():
    fed = small_federation(
        EveryClientInRound2(participation=0.5), num_clients=6, rounds=3, client_state_memory=3.5 * 4000 / 1e9
    )  # 3 rows of 4,000 bytes
    fed.run_round(1)
    models = fed.algorithm.models.clone()
    with pytest.raises(ValueError, match="4,000 bytes a client \\(notes 4,000\\) x round 2's 6 clients = 24,000"):
        fed.run_round(2)
    assert fed.round == 1 and torch.equal(fed.algorithm.models, models)


def test_the_rows_a_run_may_spill_must_fit_on_the_disk_of_their_folder(tmp_path, monkeypatch):
    folder = tmp_path / "run" / "client_state"  # not made yet: the disk is its parent's
    states = ClientStates(CPU, 2 * ROW)
    states.use_folder(folder)
    store = states.declare("v", 1000, torch.zeros(4))
    free = {"bytes": 0}

    def free_bytes(path):
        assert path == folder
        return free["bytes"]

    monkeypatch.setattr(state_limits, "free_bytes", free_bytes)
    need = (10 * 3) * ROW - 2 * ROW  # 10 clients a round x 3 rounds, 16 bytes each, less the budget's 32 bytes
    free["bytes"] = need
    assert disk_shortfall(states, 1000, 10, 3) is None
    free["bytes"] = need - 1
    message = disk_shortfall(states, 1000, 10, 3)
    assert "\n" not in message and str(folder) in message
    assert (
        f"({need:,} bytes: 16 bytes a client (v 16) x 30 clients (10 a round x 3 rounds, of 1,000) less "
        "federation.client_state_memory's 32)"
    ) in message
    assert "free 0.001 GB there" in message
    free["bytes"] = 2 * need - 1  # each of two processes keeps a file of its own
    assert "x 2 processes" in disk_shortfall(states, 1000, 10, 3, processes=2)
    free["bytes"] = 20 * ROW - 2 * ROW  # a run cannot write more clients than there are
    assert disk_shortfall(states, 20, 10, 3) is None
    assert disk_shortfall(ClientStates(CPU, 0), 1000, 10, 3) is None  # no store: nothing spills
    store.write(range(5), torch.ones(5, 4))  # 2 rows in memory, 3 in the file: a resumed run's file holds them
    free["bytes"] = need - 3 * ROW
    assert disk_shortfall(states, 1000, 10, 3) is None


def test_a_run_whose_spilled_rows_cannot_fit_on_the_disk_is_refused_at_set_up(
    tmp_path, tiny_run_args, monkeypatch, capsys
):
    monkeypatch.setattr(state_limits, "free_bytes", lambda folder: 1000)
    budget = 50_000  # 5e-5 GB: 3 rows in memory; 2 clients a round x 3 rounds = all 6 clients may spill the rest
    code = main(
        tiny_run_args
        + [
            "--algorithm",
            "ditto",
            "--federation.clients_per_round",
            "2",
            "--federation.client_state_memory",
            "5e-5",
            "--run_name",
            "full",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert f"({6 * SMALL_CNN_ROW - budget:,} bytes: " in err and str(tmp_path / "full" / "client_state") in err
    assert not (tmp_path / "full").exists()


def test_a_full_disk_while_the_file_grows_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    states = ClientStates(CPU, ROW)
    states.use_folder(tmp_path)
    store = states.declare("v", 100, torch.zeros(4))
    rows = torch.arange(12.0).reshape(3, 4)
    store.write([0, 1], rows[:2])  # one row in memory, one in the file

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    store.write([1], rows[2:])  # rewritten in place: no new disk block needed
    with pytest.raises(ClientStateDiskFull) as full_disk:
        store.write([2], rows[:1])  # a new slot
    error = full_disk.value
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    message = str(error)
    assert "\n" not in message and message.startswith(f"no space left on the disk of {tmp_path} ")
    assert "v.0.rows" in message and "federation.client_state_memory" in message and message.endswith("resume")
    assert torch.equal(store.read([0, 1]), torch.stack([rows[0], rows[2]]))


def metrics(run_dir):
    with (run_dir / "metrics.csv").open() as f:
        return [{k: v for k, v in row.items() if not k.startswith("time/")} for row in csv.DictReader(f)]


def test_a_full_disk_in_a_round_stops_the_run_in_one_line_and_the_resume_gives_the_uninterrupted_numbers(
    tmp_path, monkeypatch, capsys
):
    args = ditto_run_args(tmp_path, clients=200, per_round=2, rounds=5, memory_rows=2.5)
    assert main(args + ["--run_name", "whole"]) == 0
    real_fallocate, real_run_round = os.posix_fallocate, Federation.run_round
    rounds, failed = [], []

    def run_round(self, round):
        rounds.append(round)
        return real_run_round(self, round)

    def fallocate(fd, offset, length):
        if rounds[-1] >= 3:
            failed.append(rounds[-1])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fallocate(fd, offset, length)

    monkeypatch.setattr(Federation, "run_round", run_round)
    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    capsys.readouterr()
    full = tmp_path / "full"
    assert main(args + ["--run_name", "full"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("fedlight: warning")]
    assert failed, "no new slot of the file was needed from round 3 on"
    saved = failed[0] - 1
    assert len(lines) == 1, lines  # (the warning: each client has one test point)
    err = lines[0]
    assert err.startswith(f"fedlight: error: no space left on the disk of {full / 'client_state'} ")
    assert f"rounds 1-{saved} are saved in {full}" in err and f"--resume {full}" in err
    assert len(metrics(full)) == saved
    assert checkpoint.read(full / "checkpoints" / checkpoint.LAST)["federation"]["round"] == saved
    monkeypatch.setattr(os, "posix_fallocate", real_fallocate)
    assert main(args + ["--run_name", "full", "--resume", str(full)]) == 0
    assert metrics(full) == metrics(tmp_path / "whole")
    spilled = checkpoint.read(full / "checkpoints" / checkpoint.LAST)["federation"]["client_state"]["personal"]
    assert len(spilled["file_clients"]) > 0  # the rows beyond the budget were in the file


def test_a_held_round_larger_than_the_free_memory_is_refused_at_set_up_and_a_streamed_one_is_not(monkeypatch):
    """OCFL holds the round's trained models and starts: 2 x 6 clients x d float32 values. With less free memory than
    that it is refused with the numbers; FedAvg streams its updates and runs."""
    d = small_federation(FedAvg(), num_clients=6).flat.numel
    need = 2 * 6 * d * 4
    monkeypatch.setattr(federation_module, "available_memory", lambda device: need - 1)
    with pytest.raises(ValueError) as refused:
        small_federation(OCFL(), num_clients=6)
    assert str(refused.value).startswith(
        f"OCFL holds every update of a round: 2 x 6 clients x {d:,} parameters x 4 "
        f"bytes = {math.ceil(need / 1e6) / 1e3:g} GB, more than the "
    )
    assert "federation.clients_per_round" in str(refused.value)
    small_federation(FedAvg(), num_clients=6)
    monkeypatch.setattr(federation_module, "available_memory", lambda device: need)
    small_federation(OCFL(), num_clients=6)
