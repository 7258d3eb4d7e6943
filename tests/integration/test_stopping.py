"""Runs that cannot go on or are told to stop: a round whose server model is not finite or whose clients were all
left out stops the run in one line and keeps the last good checkpoint; SIGTERM stops a run as Ctrl-C does (exit
143); a run that fails before its first checkpoint leaves no folder, a later failure says how to go on."""

from __future__ import annotations

import csv
import os
import signal
from pathlib import Path

import pytest
import torch

from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer
from fedlight.engine.divergence import RoundDiverged, likely_cause, server_model_finite
from fedlight.engine.execution import ClientExecution
from fedlight.engine.federation import Federation
from fedlight.engine.processes import Collective
from fedlight.plugin.algorithm import Algorithm, Plan
from fedlight.run import checkpoint, termination
from fedlight.run.cli import main

from helpers.federations import small_federation


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def saved_round(run: Path, name: str = checkpoint.LAST) -> int:
    return checkpoint.read(run / "checkpoints" / name)["federation"]["round"]


class NanAfterRound2(FedAvg):
    """FedAvg whose aggregation writes one NaN into the server model in round 2 (an overflowing average)."""

    def aggregate(self, round, updates):
        super().aggregate(round, updates)
        if round == 2:
            self.models[0, 5] = float("nan")


def every_client_nan_in(round_to_fail: int):
    """`ClientExecution.train` whose clients all return a NaN loss in `round_to_fail` (an exploding loss)."""
    real_train = ClientExecution.train

    def train(self, round, clients):
        updates = real_train(self, round, clients)
        if round == round_to_fail:
            updates.train_loss[:] = float("nan")
        return updates

    return train


# -- a round that leaves nothing to go on --------------------------------------------------------------------
def test_a_server_model_that_is_not_finite_stops_the_run_in_its_round():
    fed = small_federation(NanAfterRound2(), num_clients=4, rounds=3)
    fed.run_round(1)
    with pytest.raises(RoundDiverged) as stop:
        fed.run_round(2)
    assert stop.value.round == 2 and fed.round == 1  # the round is not counted as done
    assert str(stop.value).startswith(
        "round 2: the server model is not finite after aggregation, likely a learning rate too high"
    )


def test_a_round_whose_clients_were_all_left_out_stops_the_run_and_one_left_out_does_not(monkeypatch):
    fed = small_federation(FedAvg(), num_clients=4, rounds=3)
    real_train = ClientExecution.train

    def first_client_nan_in_round_1(self, round, clients):
        updates = real_train(self, round, clients)
        if round == 1:
            updates.train_loss[0] = float("nan")
        return updates

    monkeypatch.setattr(ClientExecution, "train", first_client_nan_in_round_1)
    assert fed.run_round(1).left_out == [0]  # some clients left: the round goes on as before
    monkeypatch.setattr(ClientExecution, "train", every_client_nan_in(2))
    with pytest.raises(RoundDiverged, match="^round 2: all 4 clients of the round were left out"):
        fed.run_round(2)


class StacksEveryUpdate(FedAvg):
    """A method that looks at every update and cannot cope with none (stacking them), or fails in `fail_in`."""

    plan = Plan(holds_updates=True)

    def __init__(self, fail_in: int | None = None) -> None:
        super().__init__()
        self.fail_in = fail_in

    def pre_aggregation(self, round, updates):
        if round == self.fail_in:
            raise RuntimeError("a bug in pre_aggregation")
        torch.stack(list(updates.all().params))


def test_a_hook_that_fails_on_a_held_round_without_updates_is_reported_as_the_rounds_divergence(monkeypatch):
    fed = small_federation(StacksEveryUpdate(), num_clients=4, rounds=3)
    fed.run_round(1)
    monkeypatch.setattr(ClientExecution, "train", every_client_nan_in(2))
    with pytest.raises(RoundDiverged, match="^round 2: all 4 clients of the round were left out") as stop:
        fed.run_round(2)
    assert isinstance(stop.value.__cause__, RuntimeError)  # the hook's own error, kept as the cause
    fed = small_federation(StacksEveryUpdate(fail_in=1), num_clients=4, rounds=3)
    with pytest.raises(RuntimeError, match="a bug in pre_aggregation"):  # with updates: the hook's error as it is
        fed.run_round(1)


@pytest.mark.parametrize(
    "models, finite",
    [
        (torch.zeros(2, 3), True),
        (torch.tensor([[0.0, float("inf"), 0.0]]), False),
        (torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), False),
        (torch.zeros(0, 3), True),  # no cluster model yet
    ],
)
def test_the_server_model_is_its_cluster_models(models, finite):
    """The cluster models are checked; the personal rows need not be: only finite updates write them (below)."""
    algorithm = Algorithm()
    algorithm.models = models
    assert server_model_finite(algorithm) is finite


def test_a_client_with_a_non_finite_personal_part_is_left_out_and_its_row_not_written(monkeypatch):
    fed = small_federation(FedPer(personal_layers=1), num_clients=4, rounds=1)
    mask, real_train = fed.algorithm.personal_mask, ClientExecution.train

    def client_2_nan_in_its_personal_part(self, round, clients):
        updates = real_train(self, round, clients)
        updates.params[updates.clients == 2, mask.nonzero()[0]] = float("nan")
        return updates

    monkeypatch.setattr(ClientExecution, "train", client_2_nan_in_its_personal_part)
    assert fed.run_round(1).left_out == [2]
    assert fed.algorithm.personal.touched().tolist() == [0, 1, 3]


def test_the_likely_cause_names_round_extensions_under_the_plain_mean_and_else_the_learning_rate():
    notes = ["attack sign_flip by 4 clients"]
    assert likely_cause(notes, plain_mean=True).startswith(
        "likely attack sign_flip by 4 clients averaged by the plain mean: configure a robust aggregator.rule"
    )
    for cause in (likely_cause(notes, plain_mean=False), likely_cause([], plain_mean=True)):
        assert cause.startswith("likely a learning rate too high")


def test_a_diverged_run_says_so_in_one_line_and_keeps_the_last_good_checkpoint(
    tmp_path, tiny_run_args, monkeypatch, capsys
):
    real_aggregate = Algorithm.aggregate

    def nan_in_round_3(self, round, updates):
        real_aggregate(self, round, updates)
        if round == 3:
            self.models[0, 0] = float("nan")

    monkeypatch.setattr(Algorithm, "aggregate", nan_in_round_3)
    attack = ["--attack.kind", "sign_flip", "--attack.fraction", "0.34"]
    assert main(tiny_run_args + attack + ["--federation.rounds", "4", "--run_name", "run"]) == 1
    err = capsys.readouterr().err
    run = tmp_path / "run"
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(
        "fedlight: error: round 3: the server model is not finite after aggregation, likely "
        "attack sign_flip by 2 clients averaged by the plain mean"
    )
    assert err.strip().endswith(
        f"; the run stopped; rounds 1-2 are saved in {run} with the checkpoint of round 2, "
        "the last good one, and a resume would repeat round 3: start a new run with the fix"
    )
    assert saved_round(run) == 2 and saved_round(run, checkpoint.PREVIOUS) == 1  # round 3 wrote over neither
    assert [r["round"] for r in rows(run / "metrics.csv")] == ["1", "2"]
    assert not (run / "summary.json").exists()


def test_a_run_whose_clients_are_all_left_out_in_round_1_stops_and_leaves_no_folder(
    tmp_path, tiny_run_args, monkeypatch, capsys
):
    monkeypatch.setattr(ClientExecution, "train", every_client_nan_in(1))
    assert main(tiny_run_args + ["--run_name", "run"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedlight: error: round 1: all 6 clients of the round were left out")
    assert len(err.splitlines()) == 1 and not (tmp_path / "run").exists()


# -- failures ------------------------------------------------------------------------------------------------
def fail_in(round_to_fail: int, error: Exception):
    """`Federation.run_round` that raises `error` in `round_to_fail` (an error in the user's module)."""
    real_run_round = Federation.run_round

    def run_round(self, round):
        if round == round_to_fail:
            raise error
        return real_run_round(self, round)

    return run_round


def test_a_run_that_fails_in_round_1_leaves_no_folder_and_the_same_command_runs_again(
    tmp_path, tiny_run_args, monkeypatch
):
    from fedlight.models import Classifier

    def broken(self, batch, batch_idx):
        raise RuntimeError("a bug in training_step")

    monkeypatch.setattr(Classifier, "training_step", broken)
    args = tiny_run_args + ["--federation.vectorize", "0", "--run_name", "run"]
    with pytest.raises(RuntimeError, match="a bug in training_step") as failure:
        main(args)
    assert not (tmp_path / "run").exists() and not getattr(failure.value, "__notes__", None)
    monkeypatch.undo()
    assert main(args) == 0  # the name is free: not refused as taken, nor resumed into the same error


def test_a_later_failure_says_how_to_resume_or_start_over_after_the_traceback(tmp_path, tiny_run_args, monkeypatch):
    monkeypatch.setattr(Federation, "run_round", fail_in(3, RuntimeError("a bug in round 3")))
    with pytest.raises(RuntimeError, match="a bug in round 3") as failure:
        main(tiny_run_args + ["--run_name", "run"])
    run = tmp_path / "run"
    assert failure.value.__notes__ == [
        f"fedlight: rounds 1-2 are saved in {run}: once the cause is fixed, continue "
        f"with: python -m fedlight fit --resume {run}; or start over with another "
        "--run_name"
    ]
    monkeypatch.undo()
    assert main(["fit", "--resume", str(run)]) == 0 and len(rows(run / "metrics.csv")) == 3


def test_a_later_one_line_error_is_followed_by_one_line_saying_how_to_go_on(
    tmp_path, tiny_run_args, monkeypatch, capsys
):
    monkeypatch.setattr(Federation, "run_round", fail_in(2, ValueError("a setting the module refuses")))
    assert main(tiny_run_args + ["--run_name", "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fedlight: error: a setting the module refuses",
        f"fedlight: rounds 1-1 are saved in {tmp_path / 'run'}: once the cause is fixed, continue with: "
        f"python -m fedlight fit --resume {tmp_path / 'run'}; or start over with another --run_name",
    ]


# -- SIGTERM -------------------------------------------------------------------------------------------------
def terminate_in(round_to_stop: int):
    """`Federation.run_round` that sends this process SIGTERM in `round_to_stop`, as a scheduler would."""
    real_run_round = Federation.run_round

    def run_round(self, round):
        if round == round_to_stop:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_run_round(self, round)

    return run_round


def test_sigterm_stops_a_run_as_ctrl_c_does_with_the_resume_command_and_exit_143(
    tmp_path, tiny_run_args, monkeypatch, capsys
):
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(Federation, "run_round", terminate_in(3))
    assert main(tiny_run_args + ["--federation.rounds", "4", "--run_name", "run"]) == 143
    run = tmp_path / "run"
    assert capsys.readouterr().err.strip() == (
        f"fedlight: terminated (SIGTERM); rounds 1-2 are saved. Continue with: python -m fedlight fit --resume {run}"
    )
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is the run's alone
    assert saved_round(run) == 2
    monkeypatch.undo()
    assert main(["fit", "--resume", str(run)]) == 0 and len(rows(run / "metrics.csv")) == 4


def test_sigterm_before_the_first_checkpoint_leaves_no_folder(tmp_path, tiny_run_args, monkeypatch, capsys):
    monkeypatch.setattr(Federation, "run_round", terminate_in(1))
    assert main(tiny_run_args + ["--run_name", "run"]) == 143
    assert capsys.readouterr().err.strip() == "fedlight: terminated (SIGTERM) before the first round; nothing was saved"
    assert not (tmp_path / "run").exists()


def test_deferred_sigterm_is_only_noted_until_the_processes_ask():
    with termination.sigterm_as_interrupt():
        with termination.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            assert termination.requested_anywhere(Collective())  # noted, nothing raised
        with pytest.raises(termination.Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
    with termination.sigterm_as_interrupt():  # a new run starts with no request
        assert not termination.requested_anywhere(Collective())
