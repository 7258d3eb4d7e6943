"""No lost runs and no tracebacks: resuming by run folder alone, refusing what would corrupt a run, checkpoints that
cannot run code, clients with non-finite updates or no evaluation data, and one-line errors."""

from __future__ import annotations

import csv
import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlight.plugin import Plan
from fedlight.run import checkpoint
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.ocfl import OCFL
from fedlight.run.cli import main
from fedlight.plugin.evaluation import summarize
from fedlight.engine.execution import ClientExecution
from fedlight.engine.federation import Federation
from fedlight.run.callbacks import Run
from fedlight.run.recorder import CsvRecorder
from rich.console import Console

from helpers.federations import small_federation


def rows(path: Path, drop=("time/round_s",)) -> list[dict]:
    with path.open() as f:
        return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(f)]


def strict_json(path: Path):
    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(path.read_text(), parse_constant=refuse)


# -- resuming by run folder ---------------------------------------------------------------------------------
def test_resume_alone_continues_from_the_saved_config_and_can_only_add_rounds(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--federation.rounds", "4", "--run_name", "whole"]) == 0
    assert main(tiny_run_args + ["--federation.rounds", "2", "--run_name", "short"]) == 0
    short = tmp_path / "short"
    saved = (short / "config.yaml").read_text()
    assert main(["fit", "--resume", str(short), "--federation.rounds", "4"]) == 0  # nothing else on the line
    assert rows(short / "metrics.csv") == rows(tmp_path / "whole" / "metrics.csv")
    assert rows(short / "clients.csv") == rows(tmp_path / "whole" / "clients.csv")
    assert (short / "config.yaml").read_text() == saved.replace("rounds: 2", "rounds: 4")


@pytest.mark.parametrize(
    "override, key",
    [
        (["--seed", "5"], "seed"),
        (["--algorithm", "ocfl"], "algorithm.class_path"),
        (["--data.init_args.num_clients", "5"], "data.init_args.num_clients"),
        (["--model.init_args.lr", "0.5"], "model.init_args.lr"),
        (["--federation.local_epochs", "3"], "federation.local_epochs"),
    ],
)
def test_resume_refuses_settings_that_change_results_naming_the_key(tmp_path, tiny_run_args, capsys, override, key):
    assert main(tiny_run_args + ["--federation.rounds", "2", "--run_name", "run"]) == 0
    run = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    assert main(["fit", "--resume", str(run), "--federation.rounds", "3", *override]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedlight: error: --resume") and key in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before  # config.yaml untouched


def test_a_second_run_with_an_existing_name_is_refused_and_the_first_is_intact(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--run_name", "taken"]) == 0
    run = tmp_path / "taken"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(tiny_run_args + ["--run_name", "taken", "--seed", "3"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_runs_without_a_name_in_the_same_second_get_different_folders(tmp_path, tiny_run_args, monkeypatch):
    import fedlight.run.cli as cli

    monkeypatch.setattr(cli.time, "strftime", lambda _: "20260101-000000")
    args = [a for a in tiny_run_args] + ["--federation.rounds", "1"]
    assert main(args) == 0 and main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "algorithm-s0-20260101-000000",
        "algorithm-s0-20260101-000000-2",
    ]


# -- checkpoints -------------------------------------------------------------------------------------------
class RunsCode:
    """A pickle that would create a file when loaded with full unpickling."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_holds_code_is_refused_without_running_it(tmp_path):
    folder, marker = tmp_path / "checkpoints", tmp_path / "ran"
    folder.mkdir()
    with (folder / checkpoint.LAST).open("wb") as f:
        pickle.dump({"federation": RunsCode(marker)}, f)
    with pytest.raises(checkpoint.CheckpointError, match="cannot be read"):
        checkpoint.load(folder)
    assert not marker.exists()


def test_a_truncated_checkpoint_names_itself_and_the_previous_good_one(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--federation.rounds", "3", "--run_name", "run"]) == 0
    folder = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "previous.ckpt"]  # the last two
    assert checkpoint.read(folder / "previous.ckpt")["federation"]["round"] == 2
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    capsys.readouterr()
    assert main(["fit", "--resume", str(tmp_path / "run"), "--federation.rounds", "4"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(last) in err
    assert str(folder / "previous.ckpt") in err and "(round 2)" in err


def test_a_crash_between_the_two_renames_resumes_from_the_previous_checkpoint(tmp_path):
    folder = tmp_path / "checkpoints"
    checkpoint.save({"federation": {"round": 1}}, folder)
    checkpoint.save({"federation": {"round": 2}}, folder)
    (folder / "last.ckpt").unlink()  # the state between `last -> previous` and `tmp -> last`
    assert checkpoint.load(folder)["federation"]["round"] == 1


def test_a_checkpoint_carries_its_format_version_and_one_without_it_is_read_as_version_1(tmp_path):
    folder = tmp_path / "checkpoints"
    checkpoint.save({"federation": {"round": 1}}, folder)
    assert checkpoint.read(folder / "last.ckpt")["format_version"] == 6
    torch.save({"federation": {"round": 1}, "callbacks": {}}, folder / "last.ckpt")  # as fedlight wrote it before
    assert checkpoint.format_version(checkpoint.load(folder)) == 1


@pytest.mark.parametrize(
    "version, expected",
    [
        (7, "has format version 7, newer than this fedlight reads (up to 6): upgrade fedlight"),
        (0, "has format version 0, which this fedlight (format 6) cannot read"),
        ("2", "has format version '2', which this fedlight (format 6) cannot read"),
    ],
)
def test_a_checkpoint_of_a_format_this_code_cannot_read_is_one_line_naming_both_versions(tmp_path, version, expected):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"federation": {"round": 1}, "callbacks": {}, "format_version": version}, folder / "last.ckpt")
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.load(folder)
    message = str(error.value)
    assert expected in message and str(folder / "last.ckpt") in message and len(message.splitlines()) == 1


@pytest.mark.parametrize("where", ["first round", "logger start"])
def test_a_new_run_stopped_before_its_first_checkpoint_leaves_nothing_and_its_name_free(
    tmp_path, tiny_run_args, monkeypatch, capsys, where
):
    assert main(tiny_run_args + ["--federation.rounds", "2", "--run_name", "whole"]) == 0
    stop = lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt())  # noqa: E731
    target = (Federation, "run_round") if where == "first round" else (CsvRecorder, "on_fit_start")
    real = getattr(*target)
    monkeypatch.setattr(*target, stop)
    capsys.readouterr()
    assert main(tiny_run_args + ["--federation.rounds", "2", "--run_name", "early"]) == 130
    assert capsys.readouterr().err.strip() == "fedlight: interrupted before the first round; nothing was saved"
    assert not (tmp_path / "early").exists()  # as the message says: the name is free again
    monkeypatch.setattr(*target, real)
    assert main(tiny_run_args + ["--federation.rounds", "2", "--run_name", "early"]) == 0
    assert rows(tmp_path / "early" / "metrics.csv") == rows(tmp_path / "whole" / "metrics.csv")


def test_a_refused_resume_changes_nothing_on_disk(tmp_path, tiny_run_args, capsys):
    assert main(tiny_run_args + ["--federation.rounds", "3", "--run_name", "run"]) == 0
    run = tmp_path / "run"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["fit", "--resume", str(run), "--federation.rounds", "2"]) == 2
    assert "must be at least 3" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before  # config.yaml still says 3 rounds
    assert main(["fit", "--resume", str(run)]) == 0  # and a plain resume still works (nothing left to run)


# -- non-finite clients --------------------------------------------------------------------------------------
@pytest.mark.parametrize("vectorize", [0, 3])
def test_a_client_with_a_nan_pixel_is_left_out_of_aggregation_and_the_rest_is_averaged(vectorize):
    fed = small_federation(FedAvg(), num_clients=4, vectorize=vectorize)
    if vectorize == 0:
        fed.execution.vectorized = None
    lo = fed.data.train.bounds[2]
    fed.data.train.x[lo, 0, 3, 3] = float("nan")  # one pixel of client 2
    start = fed.algorithm.models[0].clone()
    trained = {c: fed.server.clients.train(1, c, start).params for c in (0, 1, 3)}
    n = fed.data.train.sizes().astype("float64")
    expected = sum(n[c] * trained[c].double() for c in trained) / sum(n[c] for c in trained)
    metrics = fed.run_round(1)
    assert metrics.scalars["clients_left_out"] == 1 and metrics.left_out == [2]
    assert math.isfinite(metrics.scalars["train/loss"]) and torch.isfinite(fed.algorithm.models).all()
    assert torch.allclose(fed.algorithm.models[0].double(), expected, atol=1e-5)


class ExplodesForClient1(OCFL):
    """A clustered algorithm whose client 1 returns an infinite model (an exploding loss)."""

    plan = Plan(holds_updates=True, own_training=True)

    def train_client(self, round, client, start):
        params, loss = super().train_client(round, client, start)
        return (params * float("inf"), loss) if client == 1 else (params, loss)


def test_a_non_finite_update_never_reaches_a_clustered_algorithm_and_the_run_goes_on(tmp_path):
    fed = small_federation(ExplodesForClient1(), num_clients=4, rounds=2)
    seen = []
    aggregate = fed.algorithm.pre_aggregation
    fed.algorithm.pre_aggregation = lambda round, updates: (
        seen.append(updates.all().clients.tolist()),
        aggregate(round, updates),
    )
    for round in (1, 2):
        assert fed.run_round(round).scalars["clients_left_out"] == 1
    assert seen == [[0, 2, 3], [0, 2, 3]] and torch.isfinite(fed.algorithm.models).all()


def test_left_out_clients_are_counted_in_metrics_csv_announced_and_summary_json_is_strict(
    tmp_path, tiny_run_args, monkeypatch, capsys
):
    real_train = ClientExecution.train

    def one_client_explodes(self, round, clients):
        updates = real_train(self, round, clients)
        updates.train_loss[0] = float("nan")
        return updates

    monkeypatch.setattr(ClientExecution, "train", one_client_explodes)
    assert main(tiny_run_args + ["--federation.rounds", "2", "--run_name", "run", "--algorithm", "ocfl"]) == 0
    out = capsys.readouterr().out
    assert "round 1: 1 client(s) left out of aggregation, non-finite update or loss (clients 0)" in out
    assert [r["clients_left_out"] for r in rows(tmp_path / "run" / "metrics.csv")] == ["1", "1"]
    strict_json(tmp_path / "run" / "summary.json")


def test_summary_json_writes_a_metric_no_client_has_as_null(tmp_path):
    from fedlight.run.recorder import CsvRecorder

    recorder = CsvRecorder()
    recorder.on_fit_start(Run(None, tmp_path, {}, "{}\n", "run", Console()))
    recorder.on_fit_end(None, {"test/acc_mean": float("nan"), "test/loss_mean": float("inf"), "rounds": 3})
    assert strict_json(tmp_path / "summary.json") == {"test/acc_mean": None, "test/loss_mean": None, "rounds": 3}


# -- evaluation splits -----------------------------------------------------------------------------------
def test_clients_without_evaluation_samples_are_left_out_of_the_means_not_counted_as_zero():
    fed = small_federation(FedAvg(), num_clients=4)
    test = fed.data.test
    start = test.bounds[2]  # client 0 and 1 lose their test rows, 2 and 3 keep theirs
    fed.data.test = type(test)(test.x[start:], test.y[start:], [0, 0, 0] + [b - start for b in test.bounds[3:]])
    fed.server.clients._rows["test"] = fed.data.test.client_of_row()
    summary, per_client = fed.evaluate()
    acc = per_client["acc"]
    assert np.isnan(acc[:2]).all() and np.isfinite(acc[2:]).all()
    assert summary["test/acc_mean"] == pytest.approx(acc[2:].mean())
    assert summary["test/acc_worst"] == pytest.approx(acc[2:].min())


def test_summaries_leave_out_missing_values_and_a_metric_nobody_has_is_nan():
    out = summarize({"acc": np.array([0.5, np.nan, 1.0]), "loss": np.array([np.nan, np.nan])}, "test")
    assert out["test/acc_mean"] == 0.75 and out["test/acc_std"] == 0.25 and out["test/acc_worst"] == 0.5
    assert math.isnan(out["test/loss_mean"])


def test_warnings_for_clients_without_or_with_few_evaluation_samples():
    from fedlight.engine.federation import check_evaluation_split

    with pytest.warns(UserWarning, match="2 of 5 clients have no 'test' samples"):
        check_evaluation_split(np.array([0, 0, 30, 30, 30]), "test")
    with pytest.warns(UserWarning, match=r"fewer than 10 'test' samples \(median 4\)"):
        check_evaluation_split(np.array([3, 4, 5]), "test")
    with pytest.raises(ValueError, match="no client has a sample"):
        check_evaluation_split(np.array([0, 0]), "val")


# -- one-line errors, and no run folder after a refused start ----------------------------------------------
@pytest.mark.parametrize(
    "arguments, expected",
    [
        (["--federation.round", "5"], "unknown option --federation.round (did you mean --federation.rounds?)"),
        # the names listed are the installed ones, plugins included (tests/integration/test_cli.py checks the shipped
        # ones are)
        (["--algorithm", "fedavgg"], "unknown algorithm 'fedavgg' (did you mean 'fedavg'?): choose one of "),
        (
            ["--model.init_args.network.init_args.widht", "3"],
            "model.init_args.network.init_args.widht: fedlight.models.SmallCNN has no option 'widht' (did you mean "
            "width?); its options are",
        ),
        (
            ["--algorithm.init_args.participatio", "0.5"],
            "algorithm.init_args.participatio: fedlight.Algorithm has no option 'participatio' (did you mean "
            "participation?); its options are participation",
        ),
        (["--federation.accelerator", "cuda"], "federation.accelerator=cuda, but this machine has no usable CUDA GPU"),
        (["--algorithm", "mypackage.Missing"], "algorithm: cannot import mypackage.Missing"),
    ],
)
def test_errors_are_one_line_with_the_cause_first_and_leave_no_run_folder(
    tmp_path, tiny_run_args, capsys, arguments, expected, monkeypatch
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a machine with a GPU
    assert main(tiny_run_args + arguments) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedlight: error: {expected}") and len(err.strip().splitlines()) == 1, err
    assert not any(tmp_path.iterdir())


def test_a_start_refused_by_the_data_leaves_no_run_folder(tmp_path, capsys):
    runs = tmp_path / "runs"
    assert (
        main(
            [
                "fit",
                "--data",
                "fedlight.datamodules.NpzFederated",
                "--data.path",
                str(tmp_path / "no.npz"),
                "--model",
                "fedlight.models.Classifier",
                "--model.network",
                "fedlight.models.MLP",
                "--model.network.init_args.input_dim",
                "4",
                "--model.network.init_args.hidden",
                "[8]",
                "--model.network.init_args.num_classes",
                "2",
                "--logger.wandb",
                "false",
                "--output_dir",
                str(runs),
                "--run_name",
                "x",
            ]
        )
        == 2
    )
    assert not runs.exists()


def test_ctrl_c_prints_the_resume_command_without_a_traceback(tmp_path, tiny_run_args, monkeypatch, capsys):
    real_run_round = Federation.run_round

    def interrupt_in_round_3(self, round):
        if round == 3:
            raise KeyboardInterrupt
        return real_run_round(self, round)

    monkeypatch.setattr(Federation, "run_round", interrupt_in_round_3)
    assert main(tiny_run_args + ["--federation.rounds", "4", "--run_name", "run"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == (
        f"fedlight: interrupted; rounds 1-2 are saved. Continue with: python -m fedlight fit "
        f"--resume {tmp_path / 'run'}"
    )
