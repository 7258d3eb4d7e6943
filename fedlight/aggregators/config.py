"""`AggregatorConfig`: the `aggregator:` section of a run config, how the members' updates of each cluster are
combined, beside `privacy:` and `system:` (`fedlight.aggregators.robust` holds the rules)."""
from __future__ import annotations

from dataclasses import dataclass

from fedlight.aggregators.robust import RULES
from fedlight.plugin.choices import unknown_choice


@dataclass(frozen=True)
class AggregatorConfig:
    """How the members' updates of each cluster are combined, for every algorithm that aggregates through the
    engine's cluster aggregator.

    Attributes:
        rule: "mean" (weighted, FedAvg's), "median" (coordinate-wise), "trimmed_mean" (`beta`), "krum" and
            "multikrum" (`f`, `keep`), "bulyan" (`f`), "geomed" (the geometric median, RFA's Weiszfeld iterations),
            "clipped_mean" (each update clipped to norm `clip`). All but the mean and the clipped mean hold every
            update of a round.
        f: attackers Krum, Multi-Krum and Bulyan tolerate per cluster (they need 2f+3, 2f+3 and 4f+3 clients a round).
        beta: share of values trimmed at each end of every coordinate by "trimmed_mean", in [0, 0.5).
        clip: norm each update is clipped to by "clipped_mean".
        keep: updates Multi-Krum averages (None: the clients of the cluster minus f).
    """

    rule: str = "mean"
    f: int = 1
    beta: float = 0.1
    clip: float = 1.0
    keep: int | None = None

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise unknown_choice("aggregator.rule", self.rule, RULES)
        if self.f < 0:
            raise ValueError(f"aggregator.f must be 0 or more, got {self.f}")
        if not 0 <= self.beta < 0.5:
            raise ValueError(f"aggregator.beta must be in [0, 0.5), got {self.beta}")
        if self.clip <= 0:
            raise ValueError(f"aggregator.clip must be above 0, got {self.clip}")
        if self.keep is not None and self.keep < 1:
            raise ValueError(f"aggregator.keep must be at least 1 or None, got {self.keep}")

    @property
    def holds(self) -> bool:
        """Whether the rule needs every update of a round at once."""
        return RULES[self.rule].holds
