"""One federation over two processes (gloo on the CPU) gives the numbers of one process, writes one run folder, and
resumes; the collectives reduce to the identity for one process.

Bit for bit needs each process to compute a client's update as one process does: the same trainer (here one client
at a time) and the same number of threads (CPU kernels split a batch's gradient sum by thread), so those tests pin
OMP_NUM_THREADS=1; with the default threads the numbers agree to float rounding."""
from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import small_federation
from fedlight.distributed import Collective

RUN = ["fit", "--data", "fedlight.datamodules.DigitsFederated", "--data.num_clients", "6",
       "--data.partition", "fedlight.datamodules.Rotations", "--data.partition.init_args.num_clusters", "2",
       "--model", "fedlight.models.Classifier", "--model.network", "fedlight.models.SmallCNN",
       "--model.network.init_args.width", "8", "--model.lr", "0.1", "--federation.batch_size", "32",
       "--federation.accelerator", "cpu", "--logger.wandb", "false", "--output_dir", "runs"]
EXACT = ["--federation.vectorize", "0"]  # with OMP_NUM_THREADS=1, see the module docstring


def fedlight(args: list[str], cwd: Path, threads: int | None = 1) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    env.pop("OMP_NUM_THREADS", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    result = subprocess.run([sys.executable, "-m", "fedlight", *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in csv.DictReader(f)]


def assert_same_numbers(a: Path, b: Path, rel_tol: float = 0.0) -> None:
    """The same rows and columns, and the same numbers: written identically, or within `rel_tol`."""
    for table in ("metrics.csv", "clients.csv"):
        ra, rb = rows(a / table), rows(b / table)
        assert len(ra) == len(rb) and all(x.keys() == y.keys() for x, y in zip(ra, rb)), table
        assert any(float(x["round"]) > 1 for x in ra), table  # the runs recorded more than one round
        for x, y in zip(ra, rb):
            for key in x:
                if x[key] != y[key]:
                    assert rel_tol and math.isclose(float(x[key]), float(y[key]), rel_tol=rel_tol, abs_tol=rel_tol), \
                        (table, key, x[key], y[key])


@pytest.mark.parametrize("algorithm", [["--algorithm", "fedavg"], ["--algorithm", "ocfl"],
                                       ["--algorithm", "fedper", "--algorithm.init_args.personal_layers", "1"]],
                         ids=["fedavg", "ocfl", "fedper"])
def test_two_processes_give_the_metrics_of_one_bit_for_bit_and_one_run_folder(tmp_path, algorithm):
    args = RUN + EXACT + algorithm + ["--federation.rounds", "3"]
    fedlight(args + ["--run_name", "one", "--federation.devices", "1"], tmp_path)
    fedlight(args + ["--run_name", "two", "--federation.devices", "2"], tmp_path)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["one", "two"]
    assert_same_numbers(tmp_path / "runs" / "one", tmp_path / "runs" / "two")


def test_vectorized_processes_with_default_threads_agree_to_float_rounding(tmp_path):
    args = RUN + ["--algorithm", "fedavg", "--federation.vectorize", "6", "--federation.rounds", "3"]
    fedlight(args + ["--run_name", "one", "--federation.devices", "1"], tmp_path, threads=None)
    fedlight(args + ["--run_name", "two", "--federation.devices", "2"], tmp_path, threads=None)
    assert_same_numbers(tmp_path / "runs" / "one", tmp_path / "runs" / "two", rel_tol=1e-4)


def test_a_run_over_two_processes_resumes_over_two_processes(tmp_path):
    args = RUN + EXACT + ["--algorithm", "ocfl"]
    fedlight(args + ["--run_name", "whole", "--federation.rounds", "4"], tmp_path)
    fedlight(args + ["--run_name", "split", "--federation.rounds", "2", "--federation.devices", "2"], tmp_path)
    fedlight(["fit", "--resume", "runs/split", "--federation.rounds", "4"], tmp_path)
    assert_same_numbers(tmp_path / "runs" / "whole", tmp_path / "runs" / "split")


def test_the_collectives_of_one_process_change_nothing():
    fed = small_federation(num_clients=3)
    collective = fed.collective
    assert isinstance(collective, Collective) and not collective.spread and collective.rank == 0
    values = torch.arange(5.0)
    assert collective.shard([4, 7, 9]) == [4, 7, 9] and torch.equal(collective.gather(values), values)
    assert torch.equal(collective.sum_(values.clone()), values) and collective.broadcast("x") == "x"
    assert collective.gather_objects({"a"}) == [{"a"}]
