"""The server-side services an algorithm may use: its window on the run (docs/architecture.md, "Server
services").

An algorithm receives one `ServerContext` in `setup` and keeps it as `self.server`. Beside the count of clients
and the device, its services come in eleven namespaces:

| name | what it holds |
|---|---|
| `run` | the run's facts: `seed`, `rounds`, `eval_split`, `eval_every`, `evaluates(round)` |
| `data` | `num_classes`, the server's unlabelled `public_x`, `inputs(x)` (raw samples as the model sees them) |
| `clients` | the training clients (`ClientPopulation`): sizes, splits, losses, local training, steps and rates |
| `model` | the network as flat models (`ModelView`): run, differentiated, re-initialized; its layer masks |
| `random` | streams that depend only on (seed, round, purpose): `rng`, `client_seed` |
| `state` | per-client tensors the engine keeps: `declare(name, initial)`, `drop(name)` |
| `message` | what a client's message carries beside its trained model (`MessageSchema`) |
| `aggregation` | cluster aggregators as the run configures them: `new(...)`, `private` |
| `cohort` | the round's clients (`CohortDraw`): `clients_per_round`, `draw`, `drawn`, `needs_every_client` |
| `log` | where `Algorithm.log` and `log_matrix` record this round's values (`RoundLog`) |

It holds no reference to the federation loop: what an algorithm can reach is exactly what is listed here.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.client_state import ClientState, ClientStateStores, Initial
from fedlight.plugin.cohort import CohortDraw
from fedlight.plugin.data import FederatedData
from fedlight.plugin.message import MessageSchema
from fedlight.plugin.model_view import ModelView
from fedlight.plugin.population import ClientPopulation
from fedlight.plugin.round_log import RoundLog
from fedlight.training.flat import FlatModel
from fedlight.training.sequential import ClientTrainer

if TYPE_CHECKING:  # type-only: importing Lightning costs seconds, and `fit --help` need not
    import lightning as L

    from fedlight.aggregators.cluster_aggregator import ClusterAggregation


def stream_seed(*parts: int | str) -> list[int]:
    """An integer key for numpy/torch generators from a tuple of ints and names."""
    return [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]


@dataclass(frozen=True)
class RunFacts:
    """The run's settings an algorithm reads (`server.run`).

    Attributes:
        seed: the run's seed (every random stream derives from it).
        rounds: rounds the run is configured for.
        eval_split: the client split evaluation reports on ("test", "val" or "train").
        eval_every: every client is evaluated after every this many rounds, and after the last (`evaluates`).
    """

    seed: int
    rounds: int
    eval_split: str
    eval_every: int = 1

    def evaluates(self, round: int) -> bool:
        """Whether every client is evaluated after round `round`: every `eval_every` rounds and after the last. Work
        an evaluation needs of every client (IFCA's clusters picked by loss) can then run in these rounds only."""
        return round % self.eval_every == 0 or round == self.rounds


class DataFacts:
    """What the data gives beside the clients' samples (`server.data`).

    Attributes:
        num_classes: the classes a client's labels take (0 .. num_classes - 1).
        public_x: the server's unlabelled public data, or None when the data module holds none out.
    """

    def __init__(self, data: FederatedData, transform: Callable) -> None:
        self.num_classes, self.public_x, self._transform = data.num_classes, data.public_x, transform

    def inputs(self, x: Tensor) -> Tensor:
        """Raw samples converted as the model sees them (the data module's on-device batch conversion)."""
        return self._transform((x, None), 0)[0]


@dataclass(frozen=True)
class RandomStreams:
    """Random streams that depend only on (seed, round, purpose), so resumed runs draw the same numbers
    (`server.random`)."""

    seed: int

    def rng(self, round: int, purpose: str) -> np.random.Generator:
        """A numpy generator of the (seed, round, purpose) stream."""
        return np.random.default_rng(stream_seed(self.seed, round, purpose))

    def client_seed(self, round: int, client: int, purpose: str = "train") -> int:
        """The seed of a client's local work in a round (batch order, dropout, local clustering); another `purpose`
        gives an independent stream (fine-tuning, a second batch stream)."""
        return int(np.random.SeedSequence(stream_seed(self.seed, round, client, purpose)).generate_state(1)[0])


class StateDeclarations:
    """Per-client tensors the engine keeps for the algorithm (`server.state`; `fedlight.plugin.client_state`)."""

    def __init__(self, stores: ClientStateStores, num_clients: int) -> None:
        self._stores, self._num_clients = stores, num_clients

    def declare(self, name: str, initial: Initial) -> ClientState:
        """A per-client tensor declared once in `setup`: `read(clients)`, `write(clients, rows)`, `touched()`. A
        client never written reads `initial` (a tensor of the row shape, or a callable `initial(clients) -> rows`);
        rows live in memory up to `federation.client_state_memory`, beyond it in a file of the run folder, and are
        checkpointed. What the clients' local work returns under `name` (`train_group`'s `Trained.state`,
        `train_client`'s third element) is written by the engine after `post_aggregation`."""
        return self._stores.declare(name, self._num_clients, initial)

    def drop(self, name: str) -> ClientState:
        """Remove the store `name` (its successor may then be declared): it stays readable while held, its rows leave
        the memory budget, and it is no longer checkpointed."""
        return self._stores.drop(name)


class Aggregators:
    """Cluster aggregators as the run configures them (`server.aggregation`)."""

    def __init__(self, aggregation: "ClusterAggregation") -> None:
        self._aggregation = aggregation

    def new(
        self,
        clusters: int,
        dim: int,
        dtype: torch.dtype,
        device: torch.device,
        personal_mask: Tensor | None = None,
        rows_per_client: int = 1,
    ) -> Any:
        """A fresh aggregator of rows into `clusters` cluster models of `dim` entries (`add(clusters, weights,
        values, starts)`, `reduce(updates)`, `means()`), as the run configures it
        (`fedlight.aggregators.cluster_aggregator`): the weighted mean by default, a robust rule or DP's noised mean.
        Entries under `personal_mask` are not aggregated and count in no norm or distance. `rows_per_client`: how
        many rows each client adds, one to each of that many clusters (FedEM: a copy of every component); DP then
        splits a client's clip over its rows, so the privacy unit stays the client."""
        return self._aggregation.new(clusters, dim, dtype, device, personal_mask, rows_per_client)

    @property
    def private(self) -> bool:
        """Whether the run adds DP's noise to the cluster aggregators (a `privacy:` section)."""
        return self._aggregation.privacy is not None


class ServerContext:
    """The run as an algorithm sees it. Tensors are on `device`; flat models are vectors of `model.num_params`
    entries.

    Attributes:
        num_clients: clients in the federation.
        device: where the data, the model and the server state live.
        run, data, clients, model, random, state, message, aggregation, cohort, log: the namespaces of the module
            docstring's table.
    """

    def __init__(
        self,
        data: FederatedData,
        model: L.LightningModule,
        flat: FlatModel,
        trainer: ClientTrainer,
        fabric: L.Fabric,
        transform: Callable,
        seed: int,
        rounds: int,
        eval_split: str,
        eval_batch_size: int | None,
        client_states: ClientStateStores,
        aggregation: "ClusterAggregation",
        clients_per_round: int | None = None,
        eval_every: int = 1,
        head_name: str | None = None,
    ) -> None:
        self.device = fabric.device
        self.run = RunFacts(seed, rounds, eval_split, eval_every)
        self.data = DataFacts(data, transform)
        self.random = RandomStreams(seed)
        self.model = ModelView(model, flat, trainer, fabric, self.data.inputs, eval_batch_size, head_name)
        self.clients = ClientPopulation(data, self.model.sample_losses, trainer, self.random.client_seed)
        self.model.on_gradient_pass = self.clients.gradient_pass  # a custom loop's passes are its clients' steps
        self.num_clients = self.clients.count
        self.state = StateDeclarations(client_states, self.num_clients)
        self.message = MessageSchema(client_states.stores)
        self.aggregation = Aggregators(aggregation)
        self.cohort = CohortDraw(self.num_clients, clients_per_round, self.random.rng, self.message)
        self.log = RoundLog()
