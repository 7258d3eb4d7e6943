"""`RoundWork`: what the selected clients of a round get done, as a run's round extensions decide it before they
train (a system model: clients offline, dropped out or past a deadline, and clients a deadline cuts short), and
`Arrivals`: the updates a round aggregates when they are not those of the clients it trained (an asynchronous
server's buffer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedlight.plugin.updates import Updates


@dataclass(frozen=True)
class RoundWork:
    """Attributes:
    dropped: selected clients that send nothing this round: they are not trained and count as left out
        (`RoundUpdates.left_out`), as clients whose update is not finite do, so the aggregation hooks see them.
    shares: client -> the share of its local steps it finishes, below 1 (partial work,
        `fedlight.training.work_shares`); a client not named finishes all of them.
    """

    dropped: tuple[int, ...] = ()
    shares: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cut = [c for c, share in self.shares.items() if not 0 < share < 1]
        if cut:
            raise ValueError(
                f"RoundWork.shares must lie in (0, 1): client {cut[0]} has {self.shares[cut[0]]} (drop a "
                "client that finishes nothing, leave out one that finishes everything)"
            )

    def merged(self, other: "RoundWork") -> "RoundWork":
        """Both extensions' decisions: every client either drops, and the smaller share of a client both cut."""
        dropped = tuple(sorted(set(self.dropped) | set(other.dropped)))
        shares = {c: min(s, other.shares.get(c, 1.0)) for c, s in self.shares.items()}
        shares.update({c: s for c, s in other.shares.items() if c not in shares})
        return RoundWork(dropped, {c: s for c, s in shares.items() if c not in dropped})


@dataclass(frozen=True)
class Arrivals:
    """The updates a round aggregates instead of its dispatched clients' (`RoundExtension.arrivals`).

    Attributes:
        clients: the clients whose updates arrived, sorted.
        updates: a group of `clients` -> their updates, rows in the group's order.
    """

    clients: list[int]
    updates: Callable[[list[int]], "Updates"]
