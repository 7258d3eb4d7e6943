"""How many CPU threads torch uses in a run: the cores this process may run on, not the machine's.

Torch sizes its thread pool from the machine's cores. A process confined to fewer (a CPU affinity mask, a container's
cgroup quota) or sharing them with other runs then starts more threads than cores, and its threads compete with each
other: a training step measured 10-20x slower on 2 shared cores. A run therefore takes the cores it may use, divides
them among its own processes on the machine and among the runs its launcher started beside it
(`FEDLIGHT_PARALLEL_RUNS`, set by `fedlight sweep` when it runs several at once), and uses that many threads, unless
`federation.threads` or `OMP_NUM_THREADS` says otherwise.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

PARALLEL_RUNS_VARIABLE = "FEDLIGHT_PARALLEL_RUNS"
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """The CPU quota of this process's cgroup in cores (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us` over
    `cpu.cfs_period_us`), or None when there is none or it cannot be read."""
    try:
        quota_text, period_text = (root / "cpu.max").read_text().split()[:2]
        return None if quota_text == "max" else int(quota_text) / int(period_text)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cores(root: Path = CGROUP_ROOT) -> int:
    """The cores this process may run on: its affinity mask, capped by its cgroup's quota (rounded up), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cgroup_cpu_limit(root)
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def parallel_runs() -> int:
    """How many runs the launcher started side by side on this machine (`FEDLIGHT_PARALLEL_RUNS`, default 1)."""
    value = os.environ.get(PARALLEL_RUNS_VARIABLE, "1")
    try:
        return max(1, int(value))
    except ValueError:
        raise ValueError(f"{PARALLEL_RUNS_VARIABLE}={value!r} must be a whole number of runs") from None


def sharing_environment(runs: int) -> dict[str, str]:
    """This process's environment for a process started as one of `runs` runs side by side (`parallel_runs`)."""
    return {**os.environ, PARALLEL_RUNS_VARIABLE: str(runs)}


def thread_count(
    configured: int | None, processes_here: int, cores: int | None = None, runs: int | None = None
) -> tuple[int, str]:
    """(threads per process, where the number comes from): `configured` (`federation.threads`) when given, then
    `OMP_NUM_THREADS` when set, else the usable cores shared among this machine's processes of the run and the runs
    beside it (at least one thread each)."""
    if configured is not None:
        return configured, "federation.threads"
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"]), "OMP_NUM_THREADS"
    cores = usable_cores() if cores is None else cores
    runs = parallel_runs() if runs is None else runs
    sharers = max(1, processes_here) * runs
    source = f"{cores} usable cores" + (f" shared by {sharers} processes" if sharers > 1 else "")
    return max(1, cores // sharers), source


def use_threads(configured: int | None, processes_here: int) -> tuple[int, str]:
    """Set torch's intra-op threads for this process (see `thread_count`): (how many, where from)."""
    import torch  # here, not at the top: the command line reads this module's environment helpers without torch

    threads, source = thread_count(configured, processes_here)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads, source
