"""Torch's thread count comes from the cores a process may use (affinity, cgroup quota), shared among the run's
processes and the runs beside it; cgroup files are written here in the kernel's formats."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedlight.engine import threads
from fedlight.engine.threads import cgroup_cpu_limit, thread_count, usable_cores


def write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_is_quota_over_period(tmp_path):
    write(tmp_path, "cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5


def test_cgroup_v2_without_a_quota_is_no_limit(tmp_path):
    write(tmp_path, "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v1_quota_and_its_unlimited_value(tmp_path):
    write(tmp_path, "cpu/cpu.cfs_quota_us", "300000\n")
    write(tmp_path, "cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) == 3.0
    write(tmp_path, "cpu/cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_no_cgroup_files_is_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path / "missing") is None


def test_usable_cores_is_the_affinity_capped_by_the_quota_rounded_up(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    write(tmp_path, "cpu.max", "250000 100000\n")
    assert usable_cores(tmp_path) == 3
    write(tmp_path, "cpu.max", "max 100000\n")
    assert usable_cores(tmp_path) == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert usable_cores(tmp_path) == 1


def test_cores_are_shared_among_processes_and_parallel_runs(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert thread_count(None, 1, cores=8, runs=1)[0] == 8
    assert thread_count(None, 2, cores=8, runs=1)[0] == 4
    assert thread_count(None, 2, cores=8, runs=2)[0] == 2
    assert thread_count(None, 4, cores=2, runs=3)[0] == 1  # never fewer than one thread
    monkeypatch.setenv(threads.PARALLEL_RUNS_VARIABLE, "4")
    assert thread_count(None, 1, cores=8)[0] == 2


def test_the_configured_count_then_omp_num_threads_win(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert thread_count(None, 2, cores=8, runs=1) == (3, "OMP_NUM_THREADS")
    assert thread_count(5, 2, cores=8, runs=1) == (5, "federation.threads")


def test_a_bad_parallel_runs_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(threads.PARALLEL_RUNS_VARIABLE, "two")
    with pytest.raises(ValueError, match="FEDLIGHT_PARALLEL_RUNS"):
        threads.parallel_runs()


def test_federation_threads_below_one_is_refused():
    from fedlight.engine.config import FederationConfig

    with pytest.raises(ValueError, match="federation.threads"):
        FederationConfig(threads=0)


WAIT_POLICY_PROBE = "import os, sys, fedlight; print(os.environ['OMP_WAIT_POLICY'], fedlight.WAIT_POLICY_SET)"


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE True"), ("ACTIVE", "ACTIVE False")])
def test_importing_fedlight_makes_idle_openmp_threads_sleep_unless_the_user_chose(given, expected):
    """Set before torch loads (libgomp reads it then): spinning threads of runs sharing cores cost 10x (README)."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run(
        [sys.executable, "-c", WAIT_POLICY_PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert " ".join(out) == expected


def test_a_program_that_loaded_torch_first_is_told_fedlight_did_not_choose_its_policy():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", "import torch; " + WAIT_POLICY_PROBE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["PASSIVE", "False"]  # its own threads keep torch's policy; the processes it starts get passive


class LaunchSetsThreads:
    """A Fabric whose launch sets OMP_NUM_THREADS when it is unset, as Lightning's launchers do."""

    def launch(self) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


def test_threads_set_by_the_launcher_are_not_credited_to_the_user(monkeypatch):
    """With 2 processes the start line said 'OMP_NUM_THREADS' for a number Lightning's launcher had set."""
    from fedlight.engine.devices import launch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    launch(LaunchSetsThreads())
    assert "OMP_NUM_THREADS" not in os.environ
    assert thread_count(None, 2, cores=2, runs=1) == (1, "2 usable cores shared by 2 processes")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own setting stays, and is credited
    launch(LaunchSetsThreads())
    assert thread_count(None, 2, cores=2, runs=1) == (2, "OMP_NUM_THREADS")
