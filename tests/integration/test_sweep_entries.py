"""A sweep entry's own overrides reach only that entry's runs (FedAvg-FT beside FedAvg in one sweep), a grid
over any key runs every combination, and a sweep stopped by Ctrl-C or SIGTERM exits with that run's code."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fedlight.run.sweep import SweepConfig, SweepError, combinations, fit_args


def test_an_entrys_overrides_reach_only_its_own_runs(tmp_path):
    config = SweepConfig(
        base="base.yaml",
        seeds=[0, 1],
        output_dir=str(tmp_path),
        overrides={"federation.rounds": 3},
        algorithms=[
            "fedavg",
            {"class_path": "fedavg", "name": "fedavg-ft", "overrides": {"federation.finetune_epochs": 1}},
        ],
    )
    grid = combinations(config, Path("sweep.yaml"))
    assert [c.name for c in grid] == ["fedavg-s0", "fedavg-s1", "fedavg-ft-s0", "fedavg-ft-s1"]
    plain, tuned = (fit_args(grid[i], Path("base.yaml"), config) for i in (0, 2))
    assert "--federation.finetune_epochs" not in plain
    assert tuned[tuned.index("--federation.finetune_epochs") + 1] == "1"
    assert tuned[tuned.index("--federation.rounds") + 1] == "3"  # the sweep's own overrides still apply


def test_an_unknown_key_of_an_entry_is_named():
    config = SweepConfig(base="base.yaml", algorithms=[{"class_path": "fedavg", "override": {}}])
    with pytest.raises(SweepError, match="unknown key 'override'.*overrides"):
        combinations(config, Path("sweep.yaml"))


def test_a_grid_over_any_key_runs_every_combination_with_every_algorithm_and_seed(tmp_path):
    config = SweepConfig(
        base="base.yaml",
        algorithms=["fedavg", "fedprox"],
        seeds=[0],
        output_dir=str(tmp_path),
        grid={"model.init_args.lr": [0.01, 0.1], "federation.local_epochs": [1, 2]},
    )
    grid = combinations(config, Path("sweep.yaml"))
    assert [c.name for c in grid] == [
        f"{a}-lr{lr}-local_epochs{e}-s0" for a in ("fedavg", "fedprox") for lr in (0.01, 0.1) for e in (1, 2)
    ]
    args = fit_args(grid[5], Path("base.yaml"), config)  # fedprox, lr 0.01, 2 local epochs
    assert args[args.index("--model.init_args.lr") + 1] == "0.01"
    assert args[args.index("--federation.local_epochs") + 1] == "2"
    assert "fedprox" in args[args.index("--algorithm") + 1]


def test_a_grid_without_algorithms_keeps_the_base_configs_algorithm_and_runs(tmp_path, tiny_run_args):
    from fedlight.run import sweep
    from fedlight.run.cli import main

    base = tmp_path / "base.yaml"
    options = dict(zip(tiny_run_args[1::2], tiny_run_args[2::2]))
    base.write_text(
        "\n".join(f"{k[2:]}: {v}" for k, v in options.items() if k.count(".") == 0 and k != "--output_dir") + "\n"
    )
    nested = {k[2:]: v for k, v in options.items() if "." in k}
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {
                "base": "base.yaml",
                "seeds": [0],
                "output_dir": str(tmp_path / "runs"),
                "grid": {"model.init_args.lr": [0.05, 0.2]},
                "overrides": {**nested, "federation.rounds": 1},
            }
        )
    )
    assert sweep.load(sweep_file)[0].algorithms == []
    assert (
        fit_args(combinations(sweep.load(sweep_file)[0], sweep_file)[0], base, sweep.load(sweep_file)[0]).count(
            "--algorithm"
        )
        == 0
    )
    report = sweep.run(sweep_file, main)
    lrs = [
        yaml.safe_load((tmp_path / "runs" / name / "config.yaml").read_text())["model"]["init_args"]["lr"]
        for name in ("lr0.05-s0", "lr0.2-s0")
    ]
    assert lrs == [0.05, 0.2] and report.is_file()


@pytest.mark.parametrize("code", [130, 143])
def test_a_sweep_whose_run_is_stopped_by_ctrl_c_or_sigterm_stops_with_that_runs_exit_code(tmp_path, code):
    from fedlight.run import sweep

    (tmp_path / "base.yaml").write_text("seed: 0\n")
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        yaml.safe_dump(
            {"base": "base.yaml", "seeds": [0, 1], "algorithms": ["fedavg"], "output_dir": str(tmp_path / "runs")}
        )
    )
    calls = []
    with pytest.raises(sweep.SweepInterrupted, match="rerun `fedlight sweep") as stop:
        sweep.run(sweep_file, lambda args: calls.append(args) or code)
    assert stop.value.exit_code == code and len(calls) == 1  # the next run is not started
