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

import fedlight as fedlight_package
from fedlight.engine.processes import Collective

from helpers.cli_runs import DIGITS_RUN
from helpers.federations import small_federation
from helpers.prestarted import Prestarted, ranks_env

pytestmark = pytest.mark.slow  # real processes: skipped by `pytest -m "not slow"`

RUN = DIGITS_RUN + [
    "--logger.wandb",
    "false",
    "--output_dir",
    "runs",
]
EXACT = ["--federation.vectorize", "0"]  # with OMP_NUM_THREADS=1, see the module docstring


def fedlight(args: list[str], cwd: Path, threads: int | None = 1, launcher: list[str] | None = None) -> None:
    """`python -m fedlight ARGS` in `cwd`, or the fedlight module started by `launcher` (real interpreters). Without a
    launcher, a run over two processes starts both as a launcher (torchrun) would, forked from the preloaded
    server (`tests/helpers/prestarted.py`); with `--resume` fedlight's own launcher starts the second process."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    env.pop("OMP_NUM_THREADS", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if launcher is None:
        two = "--federation.devices" in args and args[args.index("--federation.devices") + 1] == "2"
        processes = [Prestarted(args, cwd, e) for e in (ranks_env(env) if two else [env])]
        results = [(p, *p.communicate(timeout=600)) for p in processes]
    else:
        result = subprocess.run([*launcher, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        results = [(result, result.stdout, result.stderr)]
    for process, _, err in results:
        assert process.returncode == 0, err[-3000:]
        assert "deprecated" not in err, err[-3000:]  # the collectives print no warning per call


def in_this_process(args: list[str], cwd: Path, threads: int | None = 1) -> None:
    """The one-process reference run inside the test's own process (no start-up of Python, torch and Lightning to
    pay), with `threads` threads as `fedlight` runs its processes (None: the usable cores), restored afterwards."""
    from fedlight.run.cli import main

    before = torch.get_num_threads()
    pinned = [] if threads is None else ["--federation.threads", str(threads)]
    try:
        assert main(args + ["--output_dir", str(cwd / "runs"), *pinned]) == 0
    finally:
        torch.set_num_threads(before)


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
                    assert rel_tol and math.isclose(float(x[key]), float(y[key]), rel_tol=rel_tol, abs_tol=rel_tol), (
                        table,
                        key,
                        x[key],
                        y[key],
                    )


@pytest.mark.parametrize(
    "algorithm",
    [
        [
            "--algorithm",
            "fedavg",
            "--aggregator.rule",
            "clipped_mean",
            "--aggregator.clip",
            "0.3",
            "--attack.kind",
            "gaussian",
            "--attack.fraction",
            "0.34",
            "--attack.scale",
            "0.01",
        ],
        ["--algorithm", "ocfl", "--aggregator.rule", "median", "--attack.kind", "sign_flip"],
        ["--algorithm", "fedper", "--algorithm.init_args.personal_layers", "1"],
        [
            "--algorithm",
            "ditto",
            "--privacy.noise_multiplier",
            "0.5",
            "--privacy.clip",
            "0.5",
            "--privacy.adaptive",
            "true",
            "--privacy.count_noise",
            "1",
        ],
        [
            "--algorithm",
            "fedem",
            "--algorithm.init_args.num_components",
            "2",
            "--privacy.noise_multiplier",
            "0.5",
            "--privacy.clip",
            "0.5",
            "--privacy.adaptive",
            "true",
            "--privacy.count_noise",
            "1",
        ],
        ["--algorithm", "scaffold"],
        [
            "--algorithm",
            "pfedme",
            "--algorithm.init_args.participation",
            "0.5",
            "--algorithm.init_args.train_every_client",
            "false",
            "--federation.client_state_memory",
            "5e-5",
        ],
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
    ],
    ids=[
        "fedavg, clipped mean (streamed) against random updates",
        "ocfl, median (held) against sign flips",
        "fedper (personal parts)",
        "ditto (personal state in the updates) with DP-FedAvg and adaptive clipping",
        "fedem (a row per component from every client) with DP-FedAvg and adaptive clipping",
        "scaffold (control variates)",
        "pfedme (cohort only), personal models beyond three spilled to each process's file",
        "ifca with held-out clients",
    ],
)
def test_two_processes_give_the_metrics_of_one_bit_for_bit_and_one_run_folder(tmp_path, algorithm):
    args = RUN + EXACT + algorithm + ["--federation.rounds", "3"]
    in_this_process(args + ["--run_name", "one", "--federation.devices", "1"], tmp_path)
    fedlight(args + ["--run_name", "two", "--federation.devices", "2"], tmp_path)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["one", "two"]
    assert_same_numbers(tmp_path / "runs" / "one", tmp_path / "runs" / "two")


LAUNCHERS = {
    "torchrun": [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "fedlight",
    ],
    "fabric run": [
        str(Path(sys.executable).with_name("fabric")),
        "run",
        "--devices",
        "2",
        "--accelerator",
        "cpu",
        "--main-port",
        str(29400 + os.getpid() % 500),
        str(Path(fedlight_package.__file__).with_name("__main__.py")),
    ],
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_launcher_that_starts_the_processes_gives_the_same_run(tmp_path, launcher):
    args = RUN + EXACT + ["--algorithm", "ocfl", "--federation.rounds", "2"]
    in_this_process(args + ["--run_name", "one"], tmp_path)
    fedlight(args + ["--run_name", "launched", "--federation.devices", "2"], tmp_path, launcher=LAUNCHERS[launcher])
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["launched", "one"]
    assert_same_numbers(tmp_path / "runs" / "one", tmp_path / "runs" / "launched")


def test_processes_started_by_slurm_read_their_ranks_from_its_environment(tmp_path):
    """What `srun` gives each task (SLURM_NTASKS, SLURM_PROCID, ...), set by hand for two local tasks."""
    args = RUN + EXACT + ["--algorithm", "fedavg", "--federation.rounds", "2"]
    in_this_process(args + ["--run_name", "one"], tmp_path)
    slurm = {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "fedlight",
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_JOB_ID": "4321",
        "MASTER_PORT": str(20000 + os.getpid() % 5000),
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "offline",
    }
    tasks = [
        Prestarted(
            [*args, "--run_name", "srun", "--federation.devices", "2"],
            tmp_path,
            {**os.environ, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
        )
        for r in range(2)
    ]
    for task in tasks:
        _, err = task.communicate(timeout=600)
        assert task.returncode == 0, err[-3000:]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["one", "srun"]
    assert_same_numbers(tmp_path / "runs" / "one", tmp_path / "runs" / "srun")


def test_vectorized_processes_with_default_threads_agree_to_float_rounding(tmp_path):
    args = RUN + ["--algorithm", "fedavg", "--federation.vectorize", "6", "--federation.rounds", "3"]
    in_this_process(args + ["--run_name", "one", "--federation.devices", "1"], tmp_path, threads=None)
    fedlight(args + ["--run_name", "two", "--federation.devices", "2"], tmp_path, threads=None)
    assert_same_numbers(tmp_path / "runs" / "one", tmp_path / "runs" / "two", rel_tol=1e-4)


def test_a_run_over_two_processes_resumes_over_two_processes(tmp_path):
    args = RUN + EXACT + ["--algorithm", "ocfl"]
    in_this_process(args + ["--run_name", "whole", "--federation.rounds", "4"], tmp_path)
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
