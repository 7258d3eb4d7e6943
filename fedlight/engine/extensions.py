"""Round extensions: what a run adds around the algorithm's round (attackers, client-level DP, clients held out of
training) without the round naming any of them, as Flower's wrapper strategies add DP or robustness around a
strategy (docs/architecture.md, "Round extensions").

A `RoundExtension` has a no-op hook for each fixed point of the set-up and of a round; a subclass overrides the ones
it needs. The federation builds its extensions once and calls each hook on all of them in order through
`RoundExtensions`, which combines their answers.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from torch import Tensor

if TYPE_CHECKING:
    from fedlight.engine.cluster_aggregator import ClusterAggregation
    from fedlight.engine.data import FederatedData
    from fedlight.engine.federation import Federation
    from fedlight.engine.round_result import RoundResult

Extension = TypeVar("Extension", bound="RoundExtension")


class RoundExtension:
    """Hooks the federation calls, each a no-op here. Set-up: `prepare_data`, `aggregation`, `setup`, `describe`.
    Every round: `begin_round`, `tamper` (on every group's trained models), `end_round` (after aggregation),
    `cluster_scores`; every evaluated round: `client_columns`, `evaluate`. Checkpoints: `state_dict` is saved under
    `name` in the federation's state and handed back to `load_state_dict` on a resume (None when it holds none)."""

    name: str = "extension"

    # -- set-up ----------------------------------------------------------------------------------------------
    def prepare_data(self, data: "FederatedData") -> "FederatedData":
        """The clients' data as the run uses it, once after loading (before the server and the algorithm see it)."""
        return data

    def aggregation(self, aggregation: "ClusterAggregation") -> "ClusterAggregation":
        """The run's cluster aggregation (`fedlight.engine.cluster_aggregator`), before it is checked and used."""
        return aggregation

    def setup(self, federation: "Federation") -> None:
        """Keep what the hooks need of the federation (its evaluator, server, algorithm) once it is built, before
        `Algorithm.setup`."""

    def describe(self) -> str:
        """The run's start line note ('' for none)."""
        return ""

    # -- a round ---------------------------------------------------------------------------------------------
    def begin_round(self, round: int) -> None:
        """Before the algorithm's `begin_round`."""

    def tamper(self, round: int, clients: list[int], starts: Tensor, params: Tensor) -> Tensor:
        """The models `clients` send, from the models they trained (`params`) from `starts`, rows in client order."""
        return params

    def end_round(self, round: int, selected: int) -> tuple[dict[str, float], str | None]:
        """After the round's aggregation, of `selected` clients: (scalars logged with the algorithm's, a reason the
        run must stop after this round or None)."""
        return {}, None

    def cluster_scores(self, clusters: np.ndarray | None) -> dict[str, float]:
        """Scores of the algorithm's clustering (None: it does not cluster), beside `cluster/*`."""
        return {}

    def client_columns(self) -> dict[str, np.ndarray]:
        """Columns of the training clients' rows in clients.csv, one value per client."""
        return {}

    def evaluate(self, round: int, models: tuple, clusters: np.ndarray | None
                 ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """At an evaluated round, with the training clients' evaluation models (`Algorithm.evaluation_models`) and
        clusters: (summaries for metrics.csv, columns of held-out clients' rows in clients.csv)."""
        return {}, {}

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state_dict(self) -> Any:
        return None

    def load_state_dict(self, state: Any) -> None:
        """`state` as `state_dict` gave it, or None when the checkpoint holds none under `name`."""


class RoundExtensions:
    """A run's extensions in order: each hook called on every one, their answers chained or merged."""

    def __init__(self, extensions: list[RoundExtension]) -> None:
        names = [extension.name for extension in extensions]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"round extensions share the checkpoint name {repeated[0]!r}: give each its own `name`")
        self.extensions = list(extensions)

    def __iter__(self) -> Iterator[RoundExtension]:
        return iter(self.extensions)

    def find(self, kind: type[Extension]) -> Extension | None:
        """The first extension of class `kind`, or None."""
        return next((extension for extension in self.extensions if isinstance(extension, kind)), None)

    def prepare_data(self, data: "FederatedData") -> "FederatedData":
        for extension in self.extensions:
            data = extension.prepare_data(data)
        return data

    def aggregation(self, aggregation: "ClusterAggregation") -> "ClusterAggregation":
        for extension in self.extensions:
            aggregation = extension.aggregation(aggregation)
        return aggregation

    def setup(self, federation: "Federation") -> None:
        for extension in self.extensions:
            extension.setup(federation)

    def describe(self) -> list[str]:
        return [note for note in (extension.describe() for extension in self.extensions) if note]

    def begin_round(self, round: int) -> None:
        for extension in self.extensions:
            extension.begin_round(round)

    def tamper(self, round: int, clients: list[int], starts: Tensor, params: Tensor) -> Tensor:
        for extension in self.extensions:
            params = extension.tamper(round, clients, starts, params)
        return params

    def end_round(self, round: int, selected: int) -> tuple[dict[str, float], str | None]:
        """Every extension's scalars, and the first reason to stop."""
        scalars: dict[str, float] = {}
        stop = None
        for extension in self.extensions:
            found, reason = extension.end_round(round, selected)
            scalars.update(found)
            stop = stop or reason
        return scalars, stop

    def cluster_scores(self, clusters: np.ndarray | None) -> dict[str, float]:
        return {name: score for extension in self.extensions
                for name, score in extension.cluster_scores(clusters).items()}

    def client_columns(self) -> dict[str, np.ndarray]:
        return {name: column for extension in self.extensions for name, column in extension.client_columns().items()}

    def evaluate(self, result: "RoundResult", models: tuple, clusters: np.ndarray | None) -> None:
        """Add every extension's summaries to `result.evaluation` and its held-out clients' columns to
        `result.newcomers`."""
        for extension in self.extensions:
            summary, held_out = extension.evaluate(result.round, models, clusters)
            result.evaluation.update(summary)
            result.newcomers.update(held_out)

    def state_dict(self) -> dict[str, Any]:
        return {extension.name: extension.state_dict() for extension in self.extensions}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each extension's state from the federation's `state`, by its name."""
        for extension in self.extensions:
            extension.load_state_dict(state.get(extension.name))
