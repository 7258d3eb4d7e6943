"""Timing and memory helpers shared by the benchmarks: interleaved medians, device sync, peak memory."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from typing import Any, Callable

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer measures it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(
    runs: dict[str, Callable[[int], Any]], rounds: int, device: torch.device, first_round: int = 2
) -> dict[str, float]:
    """Median seconds of each run over `rounds` rounds, the runs taking turns within each round so that a
    slow spell of the machine hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(first_round, first_round + rounds):
        for name, run in runs.items():
            sync(device)
            started = time.perf_counter()
            run(r)
            sync(device)
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def peak_rss_bytes() -> int:
    """Peak resident memory of this process since the last `reset_peak_rss` (or since it started)."""
    status = _proc_status()
    if "VmHWM" in status:
        return status["VmHWM"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports kilobytes, macOS bytes


def resident_bytes() -> int:
    """Resident memory of this process now (0 where /proc is missing)."""
    return _proc_status().get("VmRSS", 0)


def reset_peak_rss() -> None:
    """Start a new peak-memory window (Linux: writing 5 to /proc/self/clear_refs resets VmHWM to VmRSS), so
    `peak_rss_bytes` measures one computation, not the set-up before it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _proc_status() -> dict[str, int]:
    try:
        with open("/proc/self/status") as f:
            return {
                k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f) if v.strip().endswith("kB")
            }
    except OSError:
        return {}
