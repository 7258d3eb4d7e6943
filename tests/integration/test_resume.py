"""A run that crashes after some rounds and is resumed ends with exactly the numbers of an uninterrupted run."""

import json

import pytest

from fedlight.run.cli import main

from helpers.resume import crash_and_resume, rows


@pytest.mark.parametrize(
    "algorithm",
    [
        ["--algorithm", "fedprox", "--algorithm.init_args.mu", "0.1", "--algorithm.init_args.participation", "0.5"],
        ["--algorithm", "local"],
        ["--algorithm", "ocfl", "--algorithm.init_args.strict", "false"],
        ["--algorithm", "flis_dc", "--algorithm.init_args.participation", "0.5", "--data.public_size", "60"],
        [
            "--algorithm",
            "ifca",
            "--algorithm.init_args.num_clusters",
            "2",
            "--data.holdout_clients",
            "2",
            "--federation.finetune_epochs",
            "1",
        ],
        ["--algorithm", "ditto", "--federation.clients_per_round", "2"],
    ],
    ids=["fedprox", "local", "ocfl", "flis_dc", "ifca with held-out clients", "ditto with 2 clients a round"],
)
def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, tiny_run_args, monkeypatch, algorithm):
    args = tiny_run_args + algorithm + ["--federation.rounds", "4"]
    assert main(args + ["--run_name", "whole"]) == 0
    crashed = tmp_path / "crashed"
    crash_and_resume(args, crashed, monkeypatch)

    whole = tmp_path / "whole"
    assert rows(crashed / "metrics.csv") == rows(whole / "metrics.csv")
    assert rows(crashed / "clients.csv") == rows(whole / "clients.csv")
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, crashed))
    for s in (a, b):
        s.pop("wall_time_s"), s.pop("run")
    assert a == b


def test_resume_needs_a_run_folder(tmp_path, tiny_run_args, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["fit", "--resume", str(empty)]) == 2
    assert "not a run folder" in capsys.readouterr().err
