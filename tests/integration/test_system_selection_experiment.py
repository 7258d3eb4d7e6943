"""The selection experiment (configs/sweeps/system_selection.yaml, docs/system_experiments.md): the sweep runs each
selector on the base config's slow devices, and benchmarks/system_selection.py tabulates run folders as worked by
hand."""

import json
import sys
from pathlib import Path

import numpy as np
import yaml

from fedlight.reports.runs import load_run
from fedlight.run.sweep import combinations, load
from fedlight.system.clock import DeviceProfiles
from fedlight.system.config import SpeedDistribution, SystemConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import system_selection  # noqa: E402


def test_the_sweep_runs_every_selector_on_40_clients_5_a_round_with_30_percent_of_them_5x_slow():
    config, base = load(ROOT / "configs" / "sweeps" / "system_selection.yaml")
    runs = combinations(config, ROOT / "configs" / "sweeps" / "system_selection.yaml")
    chosen = {(r.overrides["system.selection"], r.overrides.get("system.candidates")) for r in runs}
    assert (
        chosen
        == {("uniform", None), ("data_size", None), ("power_of_choice", 10), ("power_of_choice", 20), ("oort", 10)}
        and len(runs) == 15
    )
    run_config = yaml.safe_load(base.read_text())
    assert run_config["federation"]["clients_per_round"] == 5 and run_config["data"]["init_args"]["num_clients"] == 40
    devices = DeviceProfiles.of(SystemConfig(compute=SpeedDistribution(**run_config["system"]["compute"])), 40, seed=0)
    assert sorted(set(devices.samples_per_s.tolist())) == [20.0, 100.0]
    assert int((devices.samples_per_s == 20.0).sum()) == 12  # 30 % of 40


def fake_run(folder: Path, selection: str, seed: int, rows: list[dict], clients: list[dict], **system):
    """A run folder in miniature: metrics.csv and clients.csv with the given rows, FedAvg with `selection`."""
    folder.mkdir(parents=True)
    for name, table in (("metrics.csv", rows), ("clients.csv", clients)):
        keys = list(dict.fromkeys(k for row in table for k in row))
        lines = [",".join(keys)] + [",".join(str(row.get(k, "")) for k in keys) for row in table]
        (folder / name).write_text("\n".join(lines) + "\n")
    (folder / "summary.json").write_text(json.dumps({"run": folder.name, "algorithm": "FedAvg", "seed": seed}))
    (folder / "config.yaml").write_text(
        yaml.safe_dump({"seed": seed, "algorithm": "fedavg", "system": {"selection": selection, **system}})
    )
    return load_run(folder)


def metrics(*rows: tuple[float, float, float]) -> list[dict]:
    """Rounds 1, 2, ... of (virtual time, mean accuracy, worst accuracy)."""
    return [
        {"round": i, "system/virtual_time_s": t, "test/acc_mean": acc, "test/acc_worst": worst}
        for i, (t, acc, worst) in enumerate(rows, start=1)
    ]


def clients(last_round: int, accuracies: list[float], trained: list[tuple[int, int]]) -> list[dict]:
    """clients.csv: every client's accuracy at `last_round`, and the (round, client) pairs that trained."""
    nan = float("nan")
    return [{"round": r, "client": c, "acc": 0.5, "train/loss": 1.0} for r, c in trained if r != last_round] + [
        {"round": last_round, "client": c, "acc": acc, "train/loss": 1.0 if (last_round, c) in trained else nan}
        for c, acc in enumerate(accuracies)
    ]


def test_the_table_gives_each_selector_its_seeds_means_rounds_and_time_to_the_target(tmp_path):
    ten = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0]  # worst tenth: client 0's 0.0
    runs = [
        fake_run(
            tmp_path / "a",
            "power_of_choice",
            0,
            metrics((2.0, 0.5, 0.0), (3.0, 0.7, 0.1), (5.0, 0.6, 0.2)),
            clients(3, ten, [(1, 0), (2, 1), (3, 1)]),
            candidates=10,
        ),
        fake_run(
            tmp_path / "b",
            "power_of_choice",
            1,
            metrics((1.0, 0.4, 0.0), (2.0, 0.5, 0.0), (4.0, 0.8, 0.3)),
            clients(3, [float("nan")] + [0.5] * 9 + [0.1], [(1, 2), (3, 3)]),
            candidates=10,
        ),
        fake_run(tmp_path / "c", "oort", 0, metrics((1.0, 0.3, 0.0), (2.0, 0.4, 0.0)), clients(2, ten, [(1, 5)])),
        fake_run(tmp_path / "d", "uniform", 0, metrics((4.0, 0.9, 0.5)), clients(1, ten, [(1, 0), (1, 9)])),
    ]
    lines = system_selection.table(runs, targets=[0.7], last_rounds=2).splitlines()
    # power_of_choice (d = 10): last acc (0.6 + 0.8) / 2 = 0.7, std 0.1; last 2 rounds (0.65 + 0.65) / 2, std 0;
    # worst (0.2 + 0.3) / 2; worst tenth (0.0 + 0.1) / 2, seed 1's client 0 (no test samples) left out; 0.7 reached
    # in round 2 (3 s) and round 3 (4 s); virtual s a round 5 / 3 and 4 / 3 (mean 1.5, std 1 / 6); clients trained 2
    # ({0, 1}) and 2 ({2, 3}).
    assert lines[2:] == [
        "| FedAvg | uniform | 1 | 0.900 | 0.900 | 0.500 | 0.000 | – | 1.0 | 4.0 | 4.00 | 2.0 |",
        "| FedAvg | power_of_choice (d = 10) | 2 | 0.700 ± 0.100 | 0.650 ± 0.000 | 0.250 ± 0.050 | 0.050 ± 0.050 | – | "
        "2.5 ± 0.5 | 3.5 ± 0.5 | 1.50 ± 0.17 | 2.0 ± 0.0 |",
        "| FedAvg | oort (d = 2m) | 1 | 0.400 | 0.350 | 0.000 | 0.000 | – | not reached (0/1) | not reached (0/1) | "
        "1.00 | 1.0 |",
    ]
    assert np.isclose(system_selection.worst_share(runs[1], 0.1), 0.1)  # client 0 has no test samples: left out
    assert np.isclose(system_selection.worst_share(runs[0], 0.3), (0.0 + 0.2 + 0.4) / 3)
