"""Power-of-choice selection (Cho, Wang and Joshi, "Towards Understanding Biased Client Selection in Federated
Learning", AISTATS 2022, Algorithm 1): sample d candidates without replacement with probability proportional to
their data sizes, and pick the `count` with the highest local loss under the current model."""

from __future__ import annotations

import numpy as np

from fedlight.system.selection import SelectionContext, best, candidates


class PowerOfChoice:
    """The `count` highest-loss of d candidates drawn by data size (`wanted`: d, None: twice the cohort). The losses
    are measured on the candidates alone: one pass over their training rows per cluster model."""

    def __init__(self, context: SelectionContext, wanted: int | None = None) -> None:
        self.context, self.wanted = context, wanted

    def select(self, round: int, available: np.ndarray, count: int) -> list[int]:
        """The `count` candidates of highest mean training loss, sorted; the candidates drawn from `available` by data
        size."""
        drawn = candidates(self.context, round, available, count, self.wanted, by_size=True)
        mean_loss, _ = self.context.losses(drawn)
        return best(drawn, mean_loss, count)
