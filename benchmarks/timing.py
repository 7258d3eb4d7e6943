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


def interleaved_medians(runs: dict[str, Callable[[int], Any]], rounds: int, device: torch.device,
                        first_round: int = 2) -> dict[str, float]:
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
    """Peak resident memory of this process so far (Linux reports kilobytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
