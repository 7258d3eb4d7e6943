"""Real processes: a run killed with SIGKILL at random points and resumed ends with the numbers of an uninterrupted
run; Ctrl-C and SIGTERM (one process or two) print one line; output to a pipe is plain lines with the clustering
events."""

from __future__ import annotations

import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.cli_runs import DIGITS_RUN
from helpers.prestarted import Prestarted


pytestmark = pytest.mark.slow  # real processes: skipped by `pytest -m "not slow"`

ROUNDS = 8
RUN = DIGITS_RUN + [
    "--federation.rounds",
    str(ROUNDS),
    "--algorithm",
    "ocfl",
    "--federation.vectorize",
    "6",
    "--logger.wandb",
    "false",
]  # a fixed path: runs are compared exactly


def fedlight(args: list[str], cwd: Path, own_group: bool = False) -> Prestarted:
    """A real `python -m fedlight ARGS` process in `cwd`, forked from the preloaded server
    (`tests/helpers/prestarted.py`); `own_group`: in a process group of its own (with the processes it starts), which a
    scheduler signals as a whole."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return Prestarted(args, cwd, env, own_group=own_group)


def finished(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    process = fedlight(args, cwd)
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: v for k, v in r.items() if k != "time/round_s"} for r in csv.DictReader(f)]


def rounds_done(run: Path) -> int:
    try:
        return len(rows(run / "metrics.csv"))
    except (FileNotFoundError, KeyError):
        return 0


def kill_after(process: Prestarted, run: Path, rounds: int, delay: float) -> None:
    """SIGKILL once `rounds` rounds are in metrics.csv, `delay` seconds later (or when the run ends first)."""
    while rounds_done(run) < rounds and process.poll() is None:
        time.sleep(0.02)
    time.sleep(delay)
    process.kill()
    process.communicate()


def test_sigkill_at_random_points_then_resume_gives_the_uninterrupted_metrics(tmp_path):
    whole = finished(RUN + ["--output_dir", "runs", "--run_name", "whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr
    with (tmp_path / "runs" / "whole" / "metrics.csv").open() as f:
        round_time = sorted(float(r["time/round_s"]) for r in csv.DictReader(f))[ROUNDS // 2]
    rng = random.Random(7)  # killed during start-up, early and late; each time at a random moment of a round
    points = [
        (0, rng.uniform(0.0, 1.0)),
        (2, rng.uniform(0.0, 0.8) * round_time),
        (5, rng.uniform(0.0, 0.8) * round_time),
    ]
    for rounds, delay in points:
        name = f"killed{rounds}"
        run = tmp_path / "runs" / name
        kill_after(fedlight(RUN + ["--output_dir", "runs", "--run_name", name], tmp_path), run, rounds, delay)
        assert rounds_done(run) < ROUNDS, "the run finished before it was killed"
        args = (
            ["fit", "--resume", f"runs/{name}"]
            if (run / "config.yaml").exists()
            else RUN + ["--output_dir", "runs", "--run_name", name]
        )  # killed before the folder was made
        resumed = finished(args, tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        for table in ("metrics.csv", "clients.csv"):
            assert rows(run / table) == rows(tmp_path / "runs" / "whole" / table), (name, table)
        a, b = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "runs" / "whole", run))
        for s in (a, b):
            s.pop("wall_time_s"), s.pop("run")
        assert a == b


def saved_round(run: Path) -> int:
    import torch

    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["federation"]["round"]


@pytest.mark.parametrize(
    "stop, code, said",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated (SIGTERM)")],
    ids=["ctrl-c", "sigterm"],
)
def test_ctrl_c_or_sigterm_in_a_real_process_prints_one_line_and_the_run_resumes(tmp_path, stop, code, said):
    run = tmp_path / "runs" / "stopped"
    process = fedlight(RUN + ["--output_dir", "runs", "--run_name", "stopped"], tmp_path)
    while rounds_done(run) < 2 and process.poll() is None:
        time.sleep(0.02)
    process.send_signal(stop)
    out, err = process.communicate(timeout=120)
    assert process.returncode == code, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith(
        f"fedlight: {said}; rounds 1-{saved_round(run)} are saved. Continue with: python -m "
        "fedlight fit --resume runs/stopped"
    )
    assert finished(["fit", "--resume", "runs/stopped"], tmp_path).returncode == 0
    assert rounds_done(run) == ROUNDS


@pytest.mark.parametrize("signalled", ["every process", "the first process"])
def test_sigterm_to_two_processes_stops_both_after_one_round(tmp_path, signalled):
    """As a scheduler ends a job (every process gets SIGTERM, wherever in the round each one is), or as `kill PID`
    does (the first alone: the processes tell each other)."""
    run = tmp_path / "runs" / "two"
    process = fedlight(
        RUN + ["--output_dir", "runs", "--run_name", "two", "--federation.devices", "2"], tmp_path, own_group=True
    )
    while rounds_done(run) < 1 and process.poll() is None:
        time.sleep(0.02)
    if signalled == "every process":
        os.killpg(process.pid, signal.SIGTERM)
    else:
        process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("fedlight:")]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]  # the first process reports, the other is quiet
    saved = saved_round(run)
    assert lines[0] == (
        f"fedlight: terminated (SIGTERM); rounds 1-{saved} are saved. Continue with: python -m "
        "fedlight fit --resume runs/two"
    )
    assert rounds_done(run) == saved < ROUNDS  # the round in progress was finished and saved, no later one begun
    for _ in range(600):  # the other process is gone too
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("a process of the run outlived SIGTERM")


def test_output_to_a_pipe_is_plain_lines_with_the_clustering_events(tmp_path):
    result = finished(RUN + ["--output_dir", "runs", "--run_name", "piped", "--logger.wandb", "true"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    round_lines = [line for line in lines if line.startswith("round ") and "acc " in line]
    assert len(round_lines) == ROUNDS  # one unwrapped line per round, no progress bar in between
    assert all("(worst" in line and "loss" in line for line in round_lines)
    assert not any(ch in result.stdout for ch in "━…")  # neither a progress bar nor a cut line nor box drawing
    events = [line for line in lines if line.startswith("round ") and ": " in line.split("  ")[0]]
    assert len(events) == 1 and events[0].endswith(": 2 clusters, ARI 1.00")  # OCFL's one shot, announced once
    assert "2 clusters, ARI" in round_lines[-1]
    assert "run folder: runs/piped" in result.stdout
    assert "upload to W&B: wandb sync runs/piped/wandb/offline-run-" in result.stdout


def test_ctrl_c_while_the_modules_load_prints_one_line(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    quickstart = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
    command = [sys.executable, "-m", "fedlight", "fit", "--config", quickstart, "--print_config"]  # loads its classes
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    time.sleep(0.8)  # `list` answers in under a second now; a config's classes take seconds (torch, Lightning): the
    # signal lands while they load
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip() == "fedlight: interrupted while starting; nothing was run"


def test_ctrl_c_while_starting_stops_even_inside_a_bare_except():
    """An import guard that catches everything (a bare `except:`) cannot swallow the interrupt: the handler exits
    itself, where raising KeyboardInterrupt let such a guard go on. No torch: `fedlight.__main__` alone."""
    guard = (
        "import signal, sys, time; from fedlight.__main__ import stop_before_running; "
        "signal.signal(signal.SIGINT, stop_before_running); print('ready', flush=True)\n"
        "try:\n    time.sleep(30)\nexcept:\n    pass\nsys.exit(0)"
    )
    process = subprocess.Popen([sys.executable, "-c", guard], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "ready\n"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 130 and err.strip() == "fedlight: interrupted while starting; nothing was run"
