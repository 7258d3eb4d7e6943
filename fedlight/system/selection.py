"""How the server picks a round's clients among the available ones (`system.selection`): each way a small class
with one method, `select(round, available, count)`, built once from what it needs of the run (`SelectionContext`).
`uniform` and `data_size` are here; `power_of_choice`, `oort` and `cluster_stratified` have files of their own, and
`fedlight.system.selectors` finds each by its name.

A selector is asked only when more clients are available than the round takes; it answers `count` distinct clients
of `available`. An algorithm that overrides `select_clients` decides itself: its override's call of the base class
(`super().select_clients`) is the selector's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SelectionContext:
    """What the selectors read of the run.

    Attributes:
        rng: (round, purpose) -> a generator of the (seed, round, purpose) stream (`ServerContext.random.rng`).
        sizes: (clients,) training-set sizes.
        times_s: (clients,) each client's time for a whole round on its device (local work and transfers).
        losses: clients -> ((len,) mean training loss, (len,) root mean square of the per-sample losses) of each
            client under its cluster's current model (`fedlight.system.losses`).
        clusters: () -> (clients,) the algorithm's current assignment.
    """

    rng: Callable[[int, str], np.random.Generator]
    sizes: np.ndarray
    times_s: np.ndarray
    losses: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    clusters: Callable[[], np.ndarray]


class ClientSelector(Protocol):
    def select(self, round: int, available: np.ndarray, count: int) -> list[int]:
        """`count` distinct clients of `available` (fewer than it holds) to train in round `round`."""
        ...


def size_weights(sizes: np.ndarray) -> np.ndarray:
    """Probabilities proportional to training-set sizes (a client without training data counts one sample, so a
    draw of many never runs out of clients to pick)."""
    weights = np.maximum(np.asarray(sizes, dtype=float), 1.0)
    return weights / weights.sum()


def candidates(
    context: SelectionContext, round: int, available: np.ndarray, count: int, wanted: int | None, by_size: bool
) -> np.ndarray:
    """The d candidates a scoring selector compares: `wanted` of `available` (None: twice `count`; never fewer than
    `count` nor more than are available), drawn without replacement, proportionally to training-set size when
    `by_size`, else uniformly."""
    d = min(len(available), max(count, 2 * count if wanted is None else wanted))
    p = size_weights(context.sizes[available]) if by_size else None
    return context.rng(round, "select.candidates").choice(available, size=d, replace=False, p=p)


def best(candidates: np.ndarray, scores: np.ndarray, count: int) -> list[int]:
    """The `count` candidates with the highest scores (NaN lowest; ties: the earlier candidate), sorted."""
    order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")
    return sorted(int(c) for c in candidates[order[:count]])


class Uniform:
    """Uniformly without replacement, from the (seed, round) stream the base class draws from: with every client
    available, the clients of a run without a `system:` section."""

    def __init__(self, context: SelectionContext) -> None:
        self.context = context

    def select(self, round: int, available: np.ndarray, count: int) -> list[int]:
        """`count` clients of `available` drawn uniformly without replacement, sorted."""
        return sorted(self.context.rng(round, "select").choice(available, size=count, replace=False).tolist())


class DataSize:
    """Without replacement, each draw proportional to the clients' training-set sizes (the sampling scheme of Li et
    al.'s FedProx convergence analysis)."""

    def __init__(self, context: SelectionContext) -> None:
        self.context = context

    def select(self, round: int, available: np.ndarray, count: int) -> list[int]:
        """`count` clients of `available` drawn without replacement by training-set size (`size_weights`), sorted."""
        p = size_weights(self.context.sizes[available])
        return sorted(self.context.rng(round, "select").choice(available, size=count, replace=False, p=p).tolist())
