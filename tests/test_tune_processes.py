"""Two `fedlight tune` processes on one SQLite study (Optuna's distributed mode on one machine) finish the study's
total between them: every counted trial ran once, in its own run folder, and none is counted twice."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

TRIALS = 4


@pytest.mark.slow
def test_two_processes_sharing_one_sqlite_study_finish_its_trials_between_them(tmp_path, tiny_run_args):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"params": {"model.init_args.lr": {"type": "float", "low": 0.02, "high": 0.2}}}))
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    args = ["tune", *tiny_run_args[1:], "--space", str(space), "--trials", str(TRIALS), "--storage", storage,
            "--study", "shared", "--federation.rounds", "2", "--pruner", "none", "--sampler", "random"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "JSONARGPARSE_DEPRECATION_WARNINGS": "off"}
    processes = [subprocess.Popen([sys.executable, "-m", "fedlight", *args], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
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
    ran = [line for out, _ in outputs for line in out.splitlines() if line.startswith("trial ") and " of study " in line]
    assert len(ran) == TRIALS  # each counted trial was run by exactly one of the processes
    assert any("study shared: 4 of 4 trials have an outcome" in out for out, _ in outputs)  # the last to end
