"""`RoundExtensions`: the federation's extensions (`fedlight.plugin.extension.RoundExtension`), each hook called on
all of them in order and their answers combined (docs/architecture.md, "Round extensions")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from torch import Tensor

from fedlight.plugin.cohort import Sampling
from fedlight.plugin.extension import ExtensionContext, RoundExtension
from fedlight.plugin.message import MessageSchema
from fedlight.plugin.round_work import Arrivals, RoundWork

if TYPE_CHECKING:
    from fedlight.aggregators.cluster_aggregator import ClusterAggregation
    from fedlight.plugin.data import FederatedData
    from fedlight.engine.round_result import RoundResult
    from fedlight.plugin.updates import Updates

Extension = TypeVar("Extension", bound="RoundExtension")


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
        """The data after each extension's `prepare_data`, in order."""
        for extension in self.extensions:
            data = extension.prepare_data(data)
        return data

    def aggregation(self, aggregation: "ClusterAggregation") -> "ClusterAggregation":
        """The cluster aggregation after each extension's `aggregation`, in order."""
        for extension in self.extensions:
            aggregation = extension.aggregation(aggregation)
        return aggregation

    def setup(self, context: ExtensionContext) -> None:
        """Each extension's `setup` with the run's `context`."""
        for extension in self.extensions:
            extension.setup(context)

    def sampling(self) -> Sampling:
        """How the run chooses a round's clients: the first extension's answer that changes the uniform draw."""
        return next((found for found in (e.sampling() for e in self.extensions) if found is not None), Sampling())

    def check_message(self, schema: MessageSchema, algorithm: str) -> None:
        """Each extension's `check_message`: the first that cannot handle the message raises."""
        for extension in self.extensions:
            extension.check_message(schema, algorithm)

    def summary(self) -> dict[str, Any]:
        """Every extension's summary.json entries, merged."""
        return {key: value for extension in self.extensions for key, value in extension.summary().items()}

    def describe(self) -> list[str]:
        """The extensions' start line notes, the empty ones left out."""
        return [note for note in (extension.describe() for extension in self.extensions) if note]

    def suspects(self) -> list[str]:
        """The notes of the extensions that may make a round diverge (`RoundExtension.suspect`)."""
        return [note for note in (e.describe() for e in self.extensions if e.suspect) if note]

    def begin_round(self, round: int) -> None:
        """Each extension's `begin_round`."""
        for extension in self.extensions:
            extension.begin_round(round)

    def select(self, round: int, count: int) -> list[int] | None:
        """The first extension's draw of the round's clients, or None (the uniform draw)."""
        return next((drawn for drawn in (e.select(round, count) for e in self.extensions) if drawn is not None), None)

    def work(self, round: int, clients: list[int]) -> RoundWork:
        """What the selected clients get done: every extension's decisions merged."""
        work = RoundWork()
        for extension in self.extensions:
            found = extension.work(round, clients)
            work = work if found is None else work.merged(found)
        return work

    def arrivals(
        self, round: int, dispatched: list[int], train: Callable[[list[int]], list["Updates"]]
    ) -> Arrivals | None:
        """The first extension's arrivals (an asynchronous server's), or None: the dispatched clients' updates."""
        return next(
            (found for found in (e.arrivals(round, dispatched, train) for e in self.extensions) if found is not None),
            None,
        )

    def tamper(self, round: int, clients: list[int], starts: Tensor, params: Tensor) -> Tensor:
        """The models `clients` send: `params` through each extension's `tamper` in turn."""
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
        """Every extension's scores of the clustering, merged."""
        return {
            name: score for extension in self.extensions for name, score in extension.cluster_scores(clusters).items()
        }

    def client_columns(self) -> dict[str, np.ndarray]:
        """Every extension's clients.csv columns, merged."""
        return {name: column for extension in self.extensions for name, column in extension.client_columns().items()}

    def evaluate(self, result: "RoundResult", models: tuple, clusters: np.ndarray | None) -> None:
        """Add every extension's summaries to `result.evaluation` and its held-out clients' columns to
        `result.newcomers`."""
        for extension in self.extensions:
            summary, held_out = extension.evaluate(result.round, models, clusters)
            result.evaluation.update(summary)
            result.newcomers.update(held_out)

    def state_dict(self) -> dict[str, Any]:
        """Each extension's `state_dict` under its `name` (merged into the federation's state)."""
        return {extension.name: extension.state_dict() for extension in self.extensions}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each extension's state from the federation's `state`, by its name."""
        for extension in self.extensions:
            extension.load_state_dict(state.get(extension.name))
