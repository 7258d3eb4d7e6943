"""What a round's updates need of the federation's processes: the `Processes` protocol (met by the engine's
`fedlight.engine.processes.Collective`), the one-process case, and per-row logged values gathered over processes.

The plugin side only names the collectives it calls, so nothing here depends on how processes are started.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor


class Processes(Protocol):
    """The collectives of a federation's processes (every method is the identity for one process)."""

    world: int
    rank: int

    @property
    def spread(self) -> bool: ...

    @property
    def device(self) -> torch.device: ...

    def sum_(self, tensor: Tensor) -> Tensor: ...

    def gather(self, tensor: Tensor) -> Tensor: ...

    def gather_objects(self, obj: Any) -> list[Any]: ...


class OneProcess:
    """`Processes` of a run on one process: to call the aggregation hooks directly (tests, `RoundUpdates.of`)."""

    world, rank, spread, device = 1, 0, False, torch.device("cpu")

    def sum_(self, tensor: Tensor) -> Tensor:
        return tensor

    def gather(self, tensor: Tensor) -> Tensor:
        return tensor

    def gather_objects(self, obj: Any) -> list[Any]:
        return [obj]


def gather_logs(processes: Processes, logs: dict[str, Tensor], rows: int, device: torch.device) -> dict[str, Tensor]:
    """Per-row logged values from every process (`rows` of them on this one); a name a process did not log, e.g.
    because it trained no client this round, is NaN for its rows."""
    names = sorted(set().union(*processes.gather_objects(set(logs))))
    return {name: processes.gather(logs.get(name, torch.full((rows,), float("nan"), device=device)))
            for name in names}
