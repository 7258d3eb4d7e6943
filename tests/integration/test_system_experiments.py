"""The system experiments (configs/sweeps/system_stragglers.yaml, docs/system_experiments.md): the shipped trace makes
30 % of the clients slow, one rotation cluster's, and benchmarks/system_stragglers.py tabulates run folders as
worked by hand."""

import json
import sys
from pathlib import Path

import numpy as np
import yaml

from fedlight.reports.runs import load_run
from fedlight.system.clock import DeviceProfiles
from fedlight.system.config import SystemConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import system_stragglers  # noqa: E402


def test_the_shipped_trace_makes_the_270_degree_cluster_and_one_more_client_5x_slower():
    trace = ROOT / "configs" / "digits" / "system" / "traces" / "rot4_slow_cluster.yaml"
    devices = DeviceProfiles.of(SystemConfig(device_trace=str(trace)), 20, seed=0)
    slow = np.flatnonzero(devices.samples_per_s < devices.samples_per_s.max())
    assert slow.tolist() == [10, 15, 16, 17, 18, 19]  # 6 of 20: 30 %; the rotations' cluster 3 is clients 15-19
    assert set(devices.samples_per_s.tolist()) == {100.0, 20.0} and set(devices.link_mbps.tolist()) == {10.0}


def fake_run(folder: Path, algorithm: str, selection: str, seed: int, rows: list[dict[str, float]], **system):
    """A run folder in miniature: metrics.csv with the given rows, the config's algorithm, selection and `system`."""
    folder.mkdir(parents=True)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    lines = [",".join(keys)] + [",".join(str(row.get(k, "")) for k in keys) for row in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    (folder / "summary.json").write_text(json.dumps({"run": folder.name, "algorithm": algorithm, "seed": seed}))
    (folder / "config.yaml").write_text(
        yaml.safe_dump({"seed": seed, "algorithm": algorithm.lower(), "system": {"selection": selection, **system}})
    )
    return load_run(folder)


def row(round: int, time_s: float, acc: float, worst: float, slow: float, dropped: int, **more: float) -> dict:
    return {
        "round": round,
        "system/virtual_time_s": time_s,
        "system/dropped_deadline": dropped,
        "test/acc_mean": acc,
        "test/acc_worst": worst,
        "cluster_acc/true_3": slow,
        **more,
    }


def test_the_table_gives_each_method_and_selection_its_seeds_means_and_time_to_the_target(tmp_path):
    runs = [
        fake_run(
            tmp_path / "a",
            "IFCA",
            "cluster_stratified",
            0,
            [
                row(1, 3.0, 0.5, 0.1, 0.2, 2, **{"cluster/ari": 0.4}),
                row(2, 5.5, 0.85, 0.3, 0.4, 0, **{"cluster/ari": 0.6}),
            ],
        ),
        fake_run(
            tmp_path / "b",
            "IFCA",
            "cluster_stratified",
            1,
            [
                row(1, 3.0, 0.6, 0.2, 0.1, 1, **{"cluster/ari": 0.2}),
                row(2, 6.1, 0.7, 0.1, 0.3, 1, **{"cluster/ari": 0.4}),
            ],
        ),
        fake_run(tmp_path / "c", "FedAvg", "uniform", 0, [row(1, 3.0, 0.4, 0.0, 0.0, 3)]),
        fake_run(tmp_path / "d", "IFCA", "uniform", 0, [row(1, 2.0, 0.45, 0.0, 0.0, 0)]),
        fake_run(
            tmp_path / "e", "IFCA", "uniform", 0, [row(1, 2.0, 0.55, 0.0, 0.0, 1)], deadline_s=3.0, partial_work=True
        ),
    ]
    lines = system_stragglers.table(runs, targets=[0.5, 0.8], slow_cluster=3).splitlines()
    # IFCA: final acc (0.85 + 0.7) / 2 = 0.775, std 0.075; worst (0.3 + 0.1) / 2; slow cluster (0.4 + 0.3) / 2;
    # ARI (0.6 + 0.4) / 2; both seeds reach 0.5 in round 1 (3 s); seed 0 reaches 0.8 at 5.5 s, seed 1 never; total
    # (5.5 + 6.1) / 2; dropped 2 / 2 rounds each. Rows: algorithms and deadlines as first met, uniform selection
    # first.
    assert lines[2:] == [
        "| IFCA | none | uniform | 1 | 0.450 | 0.000 | 0.000 | – | not reached (0/1) | not reached (0/1) | 2.0 "
        "| 0.00 |",
        "| IFCA | none | cluster_stratified | 2 | 0.775 ± 0.075 | 0.200 ± 0.100 | 0.350 ± 0.050 | 0.50 ± 0.10 | "
        "3.0 ± 0.0 | 5.5 (1/2) | 5.8 ± 0.3 | 1.00 ± 0.00 |",
        "| IFCA | 3 s, partial work | uniform | 1 | 0.550 | 0.000 | 0.000 | – | 2.0 | not reached (0/1) | 2.0 | 1.00 |",
        "| FedAvg | none | uniform | 1 | 0.400 | 0.000 | 0.000 | – | not reached (0/1) | not reached (0/1) | 3.0 "
        "| 3.00 |",
    ]
