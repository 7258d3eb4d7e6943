"""`fedlight tune` as processes: two on one SQLite study (Optuna's distributed mode on one machine) finish the
study's total between them, every counted trial run once in its own folder and none counted twice; and a real
Ctrl-C leaves a study that the same command resumes, the interrupted trial's run continued from its checkpoint.
The processes are forked from a preloaded server (`tests/helpers/prestarted.py`)."""

from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path

import optuna
import pytest
import yaml

from helpers.prestarted import Prestarted, fedlight_result


TRIALS = 4


@pytest.mark.slow
def test_two_processes_sharing_one_sqlite_study_finish_its_trials_between_them(tmp_path, tiny_run_args):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"params": {"model.init_args.lr": {"type": "float", "low": 0.02, "high": 0.2}}}))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    args = [
        "tune",
        *tiny_run_args[1:],
        "--space",
        str(space),
        "--trials",
        str(TRIALS),
        "--storage",
        storage,
        "--study",
        "shared",
        "--federation.rounds",
        "2",
        "--pruner",
        "none",
        "--sampler",
        "random",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JSONARGPARSE_DEPRECATION_WARNINGS": "off"}
    processes = [Prestarted(args, Path.cwd(), env) for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-2000:]
    trials = optuna.load_study(study_name="shared", storage=storage).trials
    counted = [t for t in trials if not t.user_attrs.get("surplus")]
    assert [t.state.name for t in counted] == ["COMPLETE"] * TRIALS
    assert all(t.state.name == "FAIL" for t in trials if t.user_attrs.get("surplus"))  # started once the total was met
    folders = [Path(t.user_attrs["run_dir"]) for t in counted]
    assert len(set(folders)) == TRIALS and all((f / "summary.json").is_file() for f in folders)
    assert sorted(p.name for p in (tmp_path / "tune-shared").glob("trial-*")) == sorted(f.name for f in folders)
    ran = [
        line for out, _ in outputs for line in out.splitlines() if line.startswith("trial ") and " of study " in line
    ]
    assert len(ran) == TRIALS  # each counted trial was run by exactly one of the processes
    assert any("study shared: 4 of 4 trials have an outcome" in out for out, _ in outputs)  # the last to end


@pytest.mark.slow
def test_ctrl_c_during_a_trial_exits_130_and_the_same_command_resumes_that_trials_run(tmp_path, tiny_run_args):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"params": {"model.init_args.lr": {"type": "float", "low": 0.02, "high": 0.2}}}))
    args = [
        "tune",
        *tiny_run_args[1:],
        "--space",
        str(space),
        "--trials",
        "2",
        "--study",
        "c",
        "--federation.rounds",
        "8",
        "--pruner",
        "none",
        "--sampler_seed",
        "0",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JSONARGPARSE_DEPRECATION_WARNINGS": "off"}
    folder = tmp_path / "tune-c" / "trial-0001"
    process = Prestarted(args, Path.cwd(), env)
    deadline = time.monotonic() + 300
    while not list(folder.glob("checkpoints/*")) and time.monotonic() < deadline:
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 130 and "rerunning the same command continues it" in err
    rounds_before = len((folder / "metrics.csv").read_text().splitlines()) - 1
    assert 1 <= rounds_before < 8  # stopped inside trial 1

    again = fedlight_result(args, Path.cwd(), env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "continuing trial 1" in again.stdout
    trials = sorted(
        optuna.load_study(study_name="c", storage=f"sqlite:///{tmp_path / 'tune-c' / 'study.db'}").trials,
        key=lambda t: t.number,
    )
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    with (folder / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == list(range(1, 9))  # one run, continued: every round once
    expected = sum(float(r["val/acc_mean"]) for r in rows[-3:]) / 3  # the objective, from the CSV
    assert trials[2].params == trials[1].params and trials[2].value == pytest.approx(expected, abs=1e-6)
