"""`RoundExtension`: what a run adds around the algorithm's round (attackers, client-level DP, clients held out of
training) without the round naming any of them, as Flower's wrapper strategies add DP or robustness around a
strategy (docs/architecture.md, "Round extensions").

An extension has a no-op hook for each fixed point of the set-up and of a round; a subclass overrides the ones it
needs. The federation builds its extensions once and calls each hook on all of them in order
(`fedlight.engine.extensions.RoundExtensions`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

if TYPE_CHECKING:
    from fedlight.aggregators.cluster_aggregator import ClusterAggregation
    from fedlight.plugin.cohort import Sampling
    from fedlight.plugin.data import FederatedData
    from fedlight.plugin.algorithm import Algorithm
    from fedlight.plugin.message import MessageSchema
    from fedlight.plugin.server import ServerContext
    from fedlight.plugin.round_work import Arrivals, RoundWork
    from fedlight.plugin.updates import Updates


@dataclass(frozen=True)
class ExtensionContext:
    """What a round extension may use of the run, handed to its `setup` once the run is built (before the
    algorithm's `setup`): never the federation itself, and no other extension.

    Attributes:
        server: the run's `ServerContext` (data, models, training, random streams).
        algorithm: the run's algorithm (its `client_model`, `newcomer_models`, `assignment`).
        config: the `federation:` section (`fedlight.engine.config.FederationConfig`).
        cohort_size: the clients a round selects.
        processes: the processes that share each round's clients.
        sampling: how a round's clients are chosen (`fedlight.plugin.cohort.Sampling`, the extensions' answer).
        model: the flat model's vector as the clients train it (its size, dtype and device).
        evaluator: the training clients' evaluator (`fedlight.engine.evaluator.Evaluator`).
        true_clusters: (clients,) the training clients' true clusters, when the data defines them.
        held_out: the held-out clients of a `FederatedData`, as an algorithm sees them, and their evaluator:
            `held_out(data) -> (HeldOutClients, Evaluator)`.
    """

    server: "ServerContext"
    algorithm: "Algorithm"
    config: Any
    cohort_size: int
    processes: int
    sampling: "Sampling"
    model: Tensor
    evaluator: Any
    true_clusters: np.ndarray | None
    held_out: Callable[["FederatedData"], tuple[Any, Any]]


class RoundExtension:
    """Hooks the federation calls, each a no-op here. Set-up: `prepare_data`, `aggregation`, `sampling`, `setup`,
    `check_message`, `describe`. Every round: `begin_round`, `select` (the base class's draw of the round's clients),
    `work` (what the selected clients get done), `arrivals` (the updates an asynchronous server aggregates), `tamper`
    (on every group's trained models), `end_round` (after aggregation), `cluster_scores`; every evaluated round:
    `client_columns`, `evaluate`; at the end, `summary`. Checkpoints: `state_dict` is saved under
    `name` in the federation's state and handed back to `load_state_dict` on a resume (None when it holds none)."""

    name: str = "extension"
    #: whether its `describe` note is offered as a likely cause when a round diverges (attackers, DP's noise); a
    #: model of the clients' devices changes no update and sets it False
    suspect: bool = True

    # -- set-up ----------------------------------------------------------------------------------------------
    def prepare_data(self, data: "FederatedData") -> "FederatedData":
        """The clients' data as the run uses it, once after loading (before the server and the algorithm see it)."""
        return data

    def aggregation(self, aggregation: "ClusterAggregation") -> "ClusterAggregation":
        """The run's cluster aggregation (`fedlight.aggregators.cluster_aggregator`), before it is checked and used."""
        return aggregation

    def setup(self, context: ExtensionContext) -> None:
        """Keep what the hooks need of the run (`ExtensionContext`: its server, algorithm, evaluator, ...) once it
        is built, before `Algorithm.setup`."""

    def check_message(self, schema: "MessageSchema", algorithm: str) -> None:
        """Once the algorithm is set up: refuse, in one line naming `algorithm` and the entry, a message this
        extension cannot handle (`fedlight.plugin.message`: what clients send beside their trained models)."""

    def describe(self) -> str:
        """The run's start line note ('' for none)."""
        return ""

    def sampling(self) -> "Sampling | None":
        """How this extension makes the run choose a round's clients when it changes the uniform draw (a system
        model's availability, selection or asynchronous arrivals), for DP's accounting; None: it does not."""
        return None

    def summary(self) -> dict[str, Any]:
        """Entries for the run's summary.json (what the extension decided for the whole run), or none."""
        return {}

    # -- a round ---------------------------------------------------------------------------------------------
    def begin_round(self, round: int) -> None:
        """Before the algorithm's `begin_round`."""

    def select(self, round: int, count: int) -> list[int] | None:
        """The round's `count` clients when this extension draws them (from the clients it finds available, fewer
        when fewer are), for the base class's `select_clients` (`ServerContext.cohort.draw`); None: the uniform
        draw. Called any number of times in a round: the same answer each time."""
        return None

    def work(self, round: int, clients: list[int]) -> "RoundWork | None":
        """What the round's selected `clients` get done (`fedlight.plugin.round_work.RoundWork`: who sends nothing,
        who finishes part of the local steps), once, after the selection and before any trains; None: all of it."""
        return None

    def arrivals(
        self, round: int, dispatched: list[int], train: Callable[[list[int]], list["Updates"]]
    ) -> "Arrivals | None":
        """The updates the round aggregates when they are not the `dispatched` clients' (an asynchronous server:
        `train(clients)` trains clients now, a group at a time, and the answer names those whose updates arrive);
        None: the dispatched clients', trained when the algorithm asks for them. Once a round, after `work`."""
        return None

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

    def evaluate(
        self, round: int, models: tuple, clusters: np.ndarray | None
    ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """At an evaluated round, with the training clients' evaluation models (`Algorithm.evaluation_models`) and
        clusters: (summaries for metrics.csv, columns of held-out clients' rows in clients.csv)."""
        return {}, {}

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state_dict(self) -> Any:
        """What the extension keeps in a checkpoint, under `name` (None: nothing)."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """`state` as `state_dict` gave it, or None when the checkpoint holds none under `name`."""
