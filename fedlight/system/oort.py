"""Oort-style selection (Lai et al., "Oort: Efficient Federated Learning via Guided Participant Selection", OSDI
2021, section 4): a client's utility is its statistical utility |B_i| sqrt(mean of its squared per-sample losses)
times (T / t_i)^alpha when its round time t_i exceeds the preferred duration T; the `count` of highest utility are
picked.

Kept simple: the utility is measured now, on d candidates drawn uniformly from the available clients, under their
cluster's current model (Oort reads it from each client's last participation and explores clients never seen with
an exploration share and staleness bonus, which this leaves out, so a device several times slower than T, its
utility cut by that factor squared at alpha 2, is rarely picked at all); |B_i| is the training-set size; T is
`system.preferred_round_s`, else the deadline, else the candidates' median time.
"""

from __future__ import annotations

import numpy as np

from fedlight.system.selection import SelectionContext, best, candidates


class Oort:
    """The `count` candidates of highest Oort utility (`wanted`: d, None: twice the cohort; `alpha`: the penalty's
    exponent; `preferred_s`: T, None: the candidates' median time)."""

    def __init__(
        self, context: SelectionContext, wanted: int | None = None, alpha: float = 2.0, preferred_s: float | None = None
    ) -> None:
        self.context, self.wanted, self.alpha, self.preferred_s = context, wanted, alpha, preferred_s

    def select(self, round: int, available: np.ndarray, count: int) -> list[int]:
        """The `count` candidates of highest utility (`utility`), sorted; the candidates drawn uniformly from
        `available`."""
        drawn = candidates(self.context, round, available, count, self.wanted, by_size=False)
        _, root_mean_square = self.context.losses(drawn)
        return best(drawn, self.utility(drawn, root_mean_square), count)

    def utility(self, clients: np.ndarray, root_mean_square: np.ndarray) -> np.ndarray:
        """(len(clients),) |B_i| sqrt(mean loss^2), times (T / t_i)^alpha for the clients slower than T."""
        times = self.context.times_s[clients]
        preferred = float(np.median(times)) if self.preferred_s is None else self.preferred_s
        penalty = np.where(times > preferred, (preferred / times) ** self.alpha, 1.0)
        return self.context.sizes[clients] * root_mean_square * penalty
