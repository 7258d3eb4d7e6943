"""The server-side services an algorithm may use: its window on the run (docs/architecture.md, "Server
services").

An algorithm receives one `ServerContext` in `setup` and keeps it as `self.server`. It offers the run's facts
(clients, training-set sizes, initial model, public data, client splits), ways to run the model (outputs on any
inputs, every client's loss under K models, one client's local training), the model's layout as boolean masks
over the flat parameter vector, and random streams that depend only on (seed, round, purpose). It holds no
reference to the federation loop: what an algorithm can reach is exactly what is listed here.
"""
from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
import torch
from torch import Tensor, nn

from fedlight.plugin import model_parts
from fedlight.plugin.client_state import ClientState, ClientStates, Initial
from fedlight.plugin.data import ClientSplit, FederatedData
from fedlight.plugin.message import MessageSchema
from fedlight.plugin.population import ClientPopulation, GroupTrainer
from fedlight.plugin.round_log import RoundLog
from fedlight.training.flat import FlatModel
from fedlight.training.group_batches import GroupStep
from fedlight.training.layer_masks import layer_count_mask
from fedlight.training.local_work import LocalWork
from fedlight.training.sequential import ClientTrainer, GradientHook, Objective, Trained
from fedlight.training.vectorized import GroupHook

if TYPE_CHECKING:  # type-only: importing Lightning costs seconds, and `fit --help` need not
    import lightning as L

    from fedlight.aggregators.cluster_aggregator import ClusterAggregation


def stream_seed(*parts: int | str) -> list[int]:
    """An integer key for numpy/torch generators from a tuple of ints and names."""
    return [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]


class ServerContext:
    """The run as an algorithm sees it. Tensors are on `device`; flat models are vectors of `num_params` entries.

    Attributes:
        num_clients: clients in the federation.
        num_classes: the classes a client's labels take (0 .. num_classes - 1).
        clients_per_round: the exact count of clients every round trains (`federation.clients_per_round`), or None:
            the algorithm's `participation` share (`fedlight.plugin.cohort`).
        device: where the data, the model and the server state live.
        seed: the run's seed (every random stream below derives from it).
        rounds: rounds the run is configured for.
        eval_split: the client split evaluation reports on ("test", "val" or "train").
        eval_every: every client is evaluated after every this many rounds, and after the last (`evaluates`).
        initial_params: the model's initial flat parameters (do not write into it; clone first).
        clients: the training clients as a `ClientPopulation` (sizes, splits, losses, per-sample losses, local
            training), the same class as the engine's newcomers; the methods below on them delegate to it.
        train_sizes: (num_clients,) training-set sizes, the usual averaging weights.
        public_x: the server's unlabelled public data, or None when the data module holds none out.
        model: the LightningModule clients train; read its attributes (e.g. a centroid model's k), but change
            its weights only through `train` and `predict`, which load a flat model into it.
        round_log: where `Algorithm.log` and `Algorithm.log_matrix` record this round's values.
        every_client_work: what the algorithm declared it does on every client rather than on the round's
            (`needs_every_client`, `declare_every_client_work`), for the run's start line and summary.json's plan.
        message: what a client's message carries beside its trained model (`fedlight.plugin.message`): an
            algorithm whose clients return entries that are not client-state stores declares them in `setup`,
            `server.message.sends(name, kind)`.
    """

    def __init__(self, data: FederatedData, model: L.LightningModule, flat: FlatModel, trainer: ClientTrainer,
                 fabric: L.Fabric, transform: Callable, seed: int, rounds: int, eval_split: str,
                 eval_batch_size: int, client_states: ClientStates,
                 aggregation: "ClusterAggregation", clients_per_round: int | None = None, eval_every: int = 1,
                 head_name: str | None = None) -> None:
        self._flat, self._trainer, self._fabric = flat, trainer, fabric
        self._head_name = head_name if head_name is not None else model_parts.head_name(model)
        self._transform, self._eval_batch_size = transform, eval_batch_size
        self.model = model
        self.seed, self.rounds, self.eval_split, self.eval_every = seed, rounds, eval_split, eval_every
        self.device = fabric.device
        self.clients = ClientPopulation(data, self.predict, trainer, self.client_seed)
        self.num_clients = self.clients.count
        self.num_classes = data.num_classes
        self.clients_per_round = clients_per_round
        self.initial_params = flat.read()
        self.train_sizes = self.clients.train_sizes
        self.public_x = data.public_x
        self.round_log = RoundLog()
        self.every_client_work: list[str] = []
        self._aggregation = aggregation
        self._client_states = client_states
        self.message = MessageSchema(client_states.stores)
        self._loss_and_grads: Callable[[Tensor, Tensor, Tensor, int], tuple[Tensor, Tensor] | None] | None = None
        self._draw: Callable[[int, int], list[int] | None] = lambda round, count: None
        self._drawn: tuple[int, list[int]] | None = None  # (round, clients) of the last draw

    def bind_group_training(self, train_many: GroupTrainer,
                            loss_and_grads: Callable[[Tensor, Tensor, Tensor, int], tuple[Tensor, Tensor] | None]
                            ) -> None:
        """The engine's group training (`fedlight.engine.group_training`), which `train_many` and
        `group_loss_and_grad` hand their work to (set by the engine once its plan is made)."""
        self.clients.bind_group_training(train_many)
        self._loss_and_grads = loss_and_grads

    def bind_selection(self, draw: Callable[[int, int], list[int] | None]) -> None:
        """The engine's draw of a round's clients (`draw(round, count)`: the round extensions' `select`, a system
        model's), which `draw_clients` asks first (None: the uniform draw)."""
        self._draw = draw

    def draw_clients(self, round: int, count: int) -> list[int]:
        """The round's `count` clients as the run draws them, sorted: uniformly without replacement from a (seed,
        round) stream, or, with a `system:` section, from the clients available in the round by `system.selection`
        (all of them when fewer than `count` are available). The base class's `select_clients` is this draw."""
        drawn = self._draw(round, count)
        if drawn is None:
            n = self.num_clients
            drawn = list(range(n)) if count == n else \
                sorted(self.rng(round, "select").choice(n, size=count, replace=False).tolist())
        self._drawn = (round, list(drawn))
        return drawn

    def drawn(self, round: int) -> list[int] | None:
        """The clients `draw_clients` drew in `round` (fewer than asked when fewer were available), or None when it
        drew none in that round."""
        return list(self._drawn[1]) if self._drawn is not None and self._drawn[0] == round else None

    @property
    def num_params(self) -> int:
        return self._flat.numel

    def needs_every_client(self, method: str, when: str, instead: str | None = None, in_a_round: bool = True) -> None:
        """Refuse, in an algorithm's `setup`, a `clients_per_round` below the clients for a method that trains every
        client `when` (FL+HC's clustering round, FeSEM's seeding round): that round would break the count. `instead`
        names the method's own setting that avoids the work, offered beside leaving the count out (pFedMe's
        `algorithm.init_args.train_every_client: false`). Otherwise the work is declared
        (`declare_every_client_work`), and, `in_a_round` (not before round 1), so is that a round's aggregation needs
        every client's message (`MessageSchema.needs_every_client`)."""
        count = self.clients_per_round
        if count is not None and count < self.num_clients:
            other = f", or set {instead}" if instead else ""
            raise ValueError(f"{method} trains every client {when}, but federation.clients_per_round allows "
                             f"{count} of {self.num_clients:,}: leave clients_per_round out for {method}{other}")
        self.declare_every_client_work(f"trains every client {when}")
        if in_a_round:
            self.message.needs_every_client(when)

    def declare_every_client_work(self, what: str) -> None:
        """Say, in an algorithm's `setup`, what it does on every client rather than on the round's cohort, because
        its paper does (`what`, e.g. "every client picks its cluster by loss in each evaluated round"): the run's
        start line and summary.json's plan name it, so the cost of a cross-device run (10 of 3,400 clients a round)
        that grows with all clients is announced, not found out."""
        self.every_client_work.append(what)

    def evaluates(self, round: int) -> bool:
        """Whether every client is evaluated after round `round`: every `eval_every` rounds and after the last. Work
        an evaluation needs of every client (IFCA's clusters picked by loss) can then run in these rounds only."""
        return round % self.eval_every == 0 or round == self.rounds

    # -- data ------------------------------------------------------------------------------------------
    def split(self, name: str) -> ClientSplit:
        """Every client's samples of split `name` ("train", "val" or "test"), raw (see `inputs`)."""
        return self.clients.split(name)

    def client_of_row(self, split: str) -> Tensor:
        """(rows,) the client each row of split `split` belongs to."""
        return self.clients.client_of_row(split)

    def inputs(self, x: Tensor) -> Tensor:
        """Raw samples converted as the model sees them (the data module's on-device batch conversion)."""
        return self._transform((x, None), 0)[0]

    # -- per-client state ------------------------------------------------------------------------------------
    def client_state(self, name: str, initial: Initial) -> ClientState:
        """A per-client tensor the engine keeps for the algorithm (`fedlight.plugin.client_state`), declared once in
        `setup`: `read(clients)`, `write(clients, rows)`, `touched()`. A client never written reads `initial` (a
        tensor of the row shape, or a callable `initial(clients) -> rows`); rows live in memory up to
        `federation.client_state_memory`, beyond it in a file of the run folder, and are checkpointed. What the
        clients' local work returns under `name` (`train_group`'s `Trained.state`, `train_client`'s third element)
        is written by the engine after `post_aggregation`."""
        return self._client_states.declare(name, self.num_clients, initial)

    def drop_client_state(self, name: str) -> ClientState:
        """Remove the store `name` declared with `client_state` (its successor may then be declared): it stays
        readable while held, its rows leave the memory budget, and it is no longer checkpointed."""
        return self._client_states.drop(name)

    # -- aggregation -----------------------------------------------------------------------------------
    def cluster_aggregator(self, clusters: int, dim: int, dtype: torch.dtype, device: torch.device,
                           personal_mask: Tensor | None = None, rows_per_client: int = 1) -> Any:
        """A fresh aggregator of rows into `clusters` cluster models of `dim` entries (`add(clusters, weights,
        values, starts)`, `reduce(updates)`, `means()`), as the run configures it
        (`fedlight.aggregators.cluster_aggregator`): the weighted mean by default, a robust rule or DP's noised mean.
        Entries under `personal_mask` are not aggregated and count in no norm or distance. `rows_per_client`: how
        many rows each client adds, one to each of that many clusters (FedEM: a copy of every component); DP then
        splits a client's clip over its rows, so the privacy unit stays the client."""
        return self._aggregation.new(clusters, dim, dtype, device, personal_mask, rows_per_client)

    @property
    def private_aggregation(self) -> bool:
        """Whether the run adds DP's noise to the cluster aggregators (a `privacy:` section). Its accountant and
        adaptive clipping take the clients a round trains as the clients whose updates it releases, so a method
        that trains more clients than it aggregates must not run under it."""
        return self._aggregation.privacy is not None

    # -- running the model -----------------------------------------------------------------------------
    @property
    def head(self) -> torch.nn.Module:
        """The network's last layer, whose input is the features (`fedlight.plugin.model_parts`): methods that read
        the representation in a local objective run `head_inputs(module, server.head, x)`."""
        return model_parts.head_of(self.model, self._head_name)

    def predict(self, params: Tensor, x: Tensor) -> Tensor:
        """The outputs (logits) of the flat model `params` on raw inputs `x`, in evaluation mode, in batches
        of `federation.eval_batch_size`, as float32."""
        return self._evaluate(params, x)[1]

    def features(self, params: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
        """(features, outputs) of the flat model `params` on raw inputs `x` as `predict` runs it: the head's input
        beside the logits, float32 (class prototypes, a domain's mean representation)."""
        return self._evaluate(params, x, features=True)

    def named_tensors(self, params: Tensor) -> dict[str, Tensor]:
        """The module's parameters and buffers by qualified name (`model.named_parameters()`' names) as views of the
        flat model `params` ((d,), or (..., d) rows): another model's weights for `torch.func.functional_call`
        inside an objective (FedCP's frozen global body beside the client's own), a named tensor of every row."""
        return self._flat.views(params)

    @torch.no_grad()
    def _evaluate(self, params: Tensor, x: Tensor, features: bool = False) -> tuple[Tensor | None, Tensor]:
        self._flat.load(params)
        self.model.eval()
        size = self._eval_batch_size
        inputs, outputs = [], []
        for begin in range(0, max(len(x), 1), size):  # an empty x still gives a (0, ...) output
            batch = self.inputs(x[begin: begin + size])
            with self._fabric.autocast():
                if features:
                    feature, output = model_parts.head_inputs(self.model, self.head, batch)
                    inputs.append(feature.float())
                else:
                    output = self.model(batch)
                outputs.append(output.float())
        return (torch.cat(inputs) if features else None), torch.cat(outputs)

    @torch.no_grad()
    def client_losses(self, models: Tensor, split: str = "train", clients: list[int] | None = None) -> Tensor:
        """(K, clients) mean cross-entropy of each of K flat models on each client's split, one batched pass over
        those clients' rows per model (to pick a model by loss, as IFCA and FLIS do): `clients` in that order (a
        round's cohort), or None for every client. NaN for a client with no samples in the split."""
        return self.clients.losses(models, split, clients)

    def train(self, round: int, client: int, start: Tensor, epochs: int | None = None, lr_scale: float = 1.0,
              gradient_hook: GradientHook | None = None, purpose: str = "train",
              sample_weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Train the model from `start` on one client's training split with the module's `training_step` and
        optimizer, seeded by (seed, round, client); returns (trained flat model, mean loss of the last epoch).
        `epochs` defaults to the federation's local epochs; `gradient_hook(params, grad, start)` may edit the
        flat gradient in place after each backward pass; another `purpose` draws another stream of batches (a
        personal model's training beside the global one, fine-tuning). `sample_weights`, one per row of the
        client's training split, replace `training_step`'s loss with the batch mean of weight x cross-entropy of the
        module's outputs (a mixture component's M-step, FedEM)."""
        trained = self.clients.train(round, client, start, epochs, lr_scale, gradient_hook, purpose, sample_weights)
        return trained.params, trained.loss

    def train_many(self, round: int, clients: list[int], starts: Tensor, epochs: int | None = None,
                   lr_scale: float = 1.0, gradient_hook: GroupHook | None = None, trainable: Tensor | None = None,
                   sample_weights: list[Tensor] | None = None, purpose: str = "train",
                   objective: Objective | None = None, client_inputs: Tensor | None = None) -> Trained:
        """Train `clients` from the rows of `starts` with the module's `training_step` and optimizer, as `train`
        does for each alone (same batches, same seeds), but as one group: vectorized when the run's plan allows,
        in groups sized by memory. Returns a `Trained` (models (len(clients), d), each client's mean loss of the last
        epoch, what `training_step` logged). `gradient_hook(rows, params, grad, starts)` edits the gradients of
        the clients at positions `rows` in place after every backward pass; `trainable` ((d,) bool) trains only
        those entries, the others keep their starting values; `sample_weights` (one tensor per client, a weight
        per row of its training split) weight each sample's cross-entropy; another `purpose` draws another stream
        of batches; `objective(module, (x, y), inputs)` is each step's loss instead of `training_step`, handed the
        client's row of `client_inputs` (`fedlight.training.local_work.LocalWork`)."""
        return self.clients.train_many(round, clients, starts,
                                       LocalWork(epochs, lr_scale, gradient_hook, trainable, sample_weights, purpose,
                                                 objective, client_inputs))

    def group_batches(self, round: int, clients: list[int], epochs: int | None = None,
                      purpose: str = "train") -> Iterator[GroupStep]:
        """The steps of a custom local loop for a group of clients at once: each a `GroupStep` (epoch, step, the
        clients' positions `rows` in `clients`, and their batches stacked, (len(rows), batch, ...), converted as
        the model sees them). Client c's batches are those `batches(round, c, epochs, purpose)` gives, in the same
        order; clients whose last batch is short, or who have no batch left, are in other steps or none."""
        return self.clients.group_batches(round, clients, epochs, purpose)

    def group_loss_and_grad(self, params: Tensor, batch: Any, step: int = 0) -> tuple[Tensor, Tensor]:
        """(losses (k,), flat gradients (k, d)) of the module's `training_step` at k flat models, each on its own
        batch of a `GroupStep`: vectorized when the plan allows, else `loss_and_grad` one model after another."""
        x, y = batch
        vectorized = self._loss_and_grads(params, x, y, step)
        if vectorized is not None:
            return vectorized
        pairs = [self._trainer.loss_and_grad(p, (x[i], y[i]), step) for i, p in enumerate(params)]
        return torch.stack([loss for loss, _ in pairs]), torch.stack([grad for _, grad in pairs])

    def batches(self, round: int, client: int, epochs: int | None = None,
                purpose: str = "train") -> Iterator[tuple[int, int, Any]]:
        """(epoch, step, batch) of one client's training split for `epochs` (default: the federation's local epochs),
        converted as the model sees them: the batches `train` would take in this round for purpose "train", an
        independent stream for any other purpose. With `loss_and_grad` it is what a custom local loop needs
        (APFL, pFedMe, Per-FedAvg)."""
        return self.clients.batches(round, client, epochs, purpose)

    def loss_and_grad(self, params: Tensor, batch: Any, step: int = 0) -> tuple[Tensor, Tensor]:
        """(loss, flat gradient) of the module's `training_step` on `batch` at the flat model `params`."""
        return self._trainer.loss_and_grad(params, batch, step)

    def local_steps(self, client: int, epochs: int | None = None) -> int:
        """Optimizer steps of one client's local training: its batches times `epochs` (default: the local epochs)."""
        return self.clients.local_steps(client, epochs)

    def learning_rate(self, round: int) -> float:
        """The clients' configured learning rate at the start of round `round` (the module's optimizer and its
        schedulers, first parameter group)."""
        return self._trainer.learning_rates.round_rate(max(round, 1))

    def random_params(self, seed: int) -> Tensor:
        """A fresh random initialization of the model (every submodule's `reset_parameters`) as a flat vector,
        for cluster models that start from independent initializations."""
        saved = self._flat.read()
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(seed)
            for sub in self.model.modules():
                if callable(getattr(sub, "reset_parameters", None)):
                    sub.reset_parameters()
        fresh = self._flat.read()
        self._flat.load(saved)
        return fresh

    # -- the model's layout ----------------------------------------------------------------------------
    def layers(self) -> list[str]:
        """The network's layer names, input to output (its `layer_names()` when it declares them)."""
        return self._flat.layers()

    def layer_mask(self, layers: list[str]) -> Tensor:
        """True on every entry of the flat vector that belongs to one of the named layers."""
        return self._flat.layer_mask(layers)

    def layer_count_mask(self, count: float, side: Literal["first", "last"] = "first") -> Tensor:
        """True on the first (or last) `count` layers; a half count takes half of the boundary layer
        (`fedlight.training.layer_masks.layer_count_mask`)."""
        return layer_count_mask(self._flat, count, side)

    def head_mask(self, count: float, option: str, side: Literal["first", "last"] = "last") -> Tensor:
        """`layer_count_mask(count, side)` for one side of a body/head split (a personal head, a shared body): a
        count that takes the whole network, leaving nothing on the other side, is refused in one line naming
        `option`, the algorithm's setting."""
        layers = self.layers()
        if count >= len(layers):
            raise ValueError(f"{option} is {count:g}, the whole network ({len(layers)} layers: {', '.join(layers)}): "
                             f"give fewer than {len(layers)}, so that the split leaves layers on both sides")
        return self.layer_count_mask(count, side)

    def module_mask(self, kinds: tuple[type[nn.Module], ...]) -> Tensor:
        """True on the parameters and buffers of every submodule of one of the given types (e.g. all BatchNorm
        layers, wherever they sit in the network's layer list)."""
        model = self._flat.module
        return self._flat.mask(lambda e: isinstance(model.get_submodule(e.name.rpartition(".")[0]), kinds))

    def parameter_mask(self) -> Tensor:
        """True on trainable parameters, False on buffers (e.g. BatchNorm running statistics)."""
        return self._flat.parameter_mask()

    # -- randomness ------------------------------------------------------------------------------------
    def rng(self, round: int, purpose: str) -> np.random.Generator:
        """A numpy generator that depends only on (seed, round, purpose): resumed runs draw the same numbers."""
        return np.random.default_rng(stream_seed(self.seed, round, purpose))

    def client_seed(self, round: int, client: int, purpose: str = "train") -> int:
        """The seed of a client's local work in a round (batch order, dropout, local clustering); another `purpose`
        gives an independent stream (fine-tuning, a second batch stream)."""
        return int(np.random.SeedSequence(stream_seed(self.seed, round, client, purpose)).generate_state(1)[0])
