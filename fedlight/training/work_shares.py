"""`WorkShares`: the share of its local steps each client finishes in a round, for clients a deadline cuts short
(FedProx's partial work: "Federated Optimization in Heterogeneous Networks", Li et al., MLSys 2020, section 5.2,
where stragglers run fewer local updates and still send them).

The engine sets the shares for the duration of a round's local work (`during`); every trainer asks `steps` for the
steps a client takes of a call: the module's SGD, one client after another (`ClientTrainer.fit`'s `max_steps`), and
the batches of custom loops (`group_batches`). Outside that window (fine-tuning, newcomers, set-up phases) every
client finishes all of its steps.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

#: a share times the steps is rounded to this many decimals before its floor is taken, so float error in a share
#: (0.7 x 10 = 6.999999999999999) never takes a step away
SHARE_DECIMALS = 9


class WorkShares:
    """Client -> the share of its local steps it finishes in the current round's local work (below 1: cut short)."""

    def __init__(self) -> None:
        self._shares: dict[int, float] = {}

    @contextlib.contextmanager
    def during(self, shares: dict[int, float]) -> Iterator[None]:
        """`shares` in force inside the block (the clients of one round's local work), the earlier ones after it."""
        before, self._shares = self._shares, dict(shares)
        try:
            yield
        finally:
            self._shares = before

    def cuts(self, clients: Iterable[int]) -> bool:
        """Whether any of `clients` is cut short now."""
        return any(self._shares.get(c, 1.0) < 1 for c in clients)

    def steps(self, client: int, steps: int) -> int | None:
        """The steps `client` takes of a call of `steps` local steps: None when it takes them all, else its share of
        them rounded down, at least one (the engine drops a client that finishes no step instead)."""
        share = self._shares.get(client)
        if share is None or share >= 1:
            return None
        return max(1, math.floor(round(share * steps, SHARE_DECIMALS)))
