"""benchmarks/same_numbers.py's `compare`: two made run folders, the same but for one value, and the timings it
leaves out."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import same_numbers  # noqa: E402

METRICS = "round,train/loss,test/acc_mean,time/round_s\n1,2.5,0.25,1.7\n2,2.0,0.5,1.2\n"
CLIENTS = "round,client,acc,samples\n1,0,0.25,10\n1,1,0.5,12\n2,0,0.5,10\n2,1,0.75,12\n"


def made_run(folder: Path, metrics: str = METRICS, clients: str = CLIENTS, matrix: np.ndarray | None = None) -> Path:
    (folder / "matrices").mkdir(parents=True)
    (folder / "metrics.csv").write_text(metrics)
    (folder / "clients.csv").write_text(clients)
    np.save(folder / "matrices" / "distance_round0001.npy", np.eye(3) if matrix is None else matrix)
    return folder


def test_runs_alike_but_for_their_timings_are_identical(tmp_path, capsys):
    made_run(tmp_path / "a" / "fedavg")
    made_run(tmp_path / "b" / "fedavg", metrics=METRICS.replace("1.7", "9.9").replace("1.2", "0.3"))
    assert same_numbers.compare(tmp_path / "a", tmp_path / "b") == 0
    assert capsys.readouterr().out.splitlines()[0] == "fedavg: identical"


def test_one_differing_client_value_is_reported_with_both_values(tmp_path, capsys):
    made_run(tmp_path / "a" / "fedavg")
    made_run(tmp_path / "b" / "fedavg", clients=CLIENTS.replace("2,1,0.75", "2,1,0.7500001"))
    assert same_numbers.compare(tmp_path / "a", tmp_path / "b") == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line == (
        "fedavg: DIFFERS: clients.csv row 4 (round 2, client 1) column acc: 0.75 vs 0.7500001; "
        "1 cells differ, max abs difference 1e-07"
    )


def test_one_differing_matrix_entry_is_reported_with_its_index(tmp_path, capsys):
    made_run(tmp_path / "a" / "ifca")
    changed = np.eye(3)
    changed[2, 1] = -0.5
    made_run(tmp_path / "b" / "ifca", matrix=changed)
    assert same_numbers.compare(tmp_path / "a", tmp_path / "b") == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("ifca: DIFFERS: matrices/distance_round0001.npy entry [2, 1]: ")
    assert line.endswith("1 entries differ, max abs difference 0.5")


def test_a_run_recorded_on_one_side_only_differs(tmp_path, capsys):
    made_run(tmp_path / "a" / "fedavg")
    made_run(tmp_path / "a" / "ditto")
    made_run(tmp_path / "b" / "fedavg")
    assert same_numbers.compare(tmp_path / "a", tmp_path / "b") == 1
    assert capsys.readouterr().out.splitlines()[:2] == ["ditto: DIFFERS: recorded only before", "fedavg: identical"]


@pytest.mark.parametrize(
    "column, timing",
    [
        ("time/round_s", True),
        ("probe_seconds", True),
        ("wall_s", True),
        ("train/loss", False),
        ("samples", False),
        ("test/acc_std", False),
    ],
)
def test_timing_columns_are_named_after_time_or_seconds(column, timing):
    assert same_numbers.is_timing(column) is timing


def test_every_algorithm_of_the_project_is_recorded():
    from importlib.metadata import entry_points

    shipped = {e.name for e in entry_points(group="fedlight.algorithms")}
    recorded = set()
    for r in same_numbers.recordings():
        text = r.config.read_text() + " ".join(r.options)
        recorded |= {
            name
            for name in shipped
            if f"algorithm: {name}" in text
            or f"class_path: {name}\n" in text
            or f"--algorithm {name}" in " ".join(r.options)
        }
    assert recorded == shipped
