"""The plugin boundary: an `Algorithm` decides what each client starts from and how updates are combined.

Every algorithm holds the server state in one general form (docs/architecture.md, "Server state"):

- `models`: (K, d) cluster models, rows of one matrix (K = 1: one global model);
- `assignment`: (n,) each client's cluster, a row of `models`;
- `personal_mask`: (d,) True on the entries each client keeps for itself (None: nothing is personal), and
  `personal`: every client's values of those entries, a client-state store of rows of width p
  (`fedlight.plugin.personal_part`): `personal.read(clients)`, `personal[c]`; rows are stored for the clients
  that trained, the others read their values from when the mask was set.

A client's model is its cluster's row with its personal entries written in. The base class is FedAvg in that
form; a clustered algorithm changes `assignment` and `models`, a personalized one sets a personal mask, and the
rest (cluster-wise weighted averaging, merging shared and personal parts, checkpointing) is inherited.

One `Plan` on the class declares how its rounds run (docs/architecture.md, "The plan"): `holds_updates` (the
aggregation hooks compare every update, so the round is held whole instead of streamed), `own_training`
(`train_client` is the algorithm's own local work, not the module's SGD) and `corrects_gradient` (`local_gradient`
edits every client's gradient). What a client sends is declared on `server.message`; what the extensions do with
it is derived from that (`fedlight.plugin.message`), and an algorithm that combines its updates without the
engine's cluster aggregator is found out after round 1.

The hooks, in the order of a round. Queries (marked ?) change nothing; only commands change state, and commands
may record scalars and matrices as they act (`log`, `log_matrix`).

    extend_model(parts)                before set-up: add the method's own modules to the model (a personal head)
    setup(server)                      once: build the state; `server` is the run's `ServerContext`
    begin_round(round)                 first thing in a round: one-time phases
    select_clients(round) ?            the clients that train
    train_group(round, clients, starts) a group's local work: the module's SGD (`server.clients.train_many`) by default
    train_client(round, client, start) one client's own local work (only with Plan(own_training=True))
      learning_rate_scale(round) ?     SGD clients train at the configured learning rate times this
      local_gradient(client, ...)      ... with the gradient edited in place (only with Plan(corrects_gradient=True))
    pre_aggregation(round, updates)    look at the round's updates: cluster clients, fire triggers
    aggregate(round, updates)          combine them: FedAvg within each cluster
    post_aggregation(round, updates)   afterwards: reassign clients, schedules
    evaluation_models() ?              the model every client is evaluated with
    newcomer_models(newcomers) ?       a model for each held-out client (arrived after training)
    cluster_labels() ?                 the clustering to log and score against the true clusters
    round_metrics() ?                  scalars of the state after the round (optional: commands `log` as they act)
    state_dict() ?, load_state_dict(state)  what survives a restart
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.aggregation import ClientModels
from fedlight.plugin.client_state import ClientState
from fedlight.plugin.cohort import Cohort
from fedlight.plugin.shared_body import SharedBodyModels, personal_heads
from fedlight.plugin.personal_part import PersonalStart, leaving_means, reslice, store_name
from fedlight.plugin.updates import Updates
from fedlight.training.sequential import Trained
from fedlight.training.vectorized import GroupHook

if TYPE_CHECKING:
    from fedlight.cluster.differences import Differences
    from fedlight.plugin.model_parts import ModelParts
    from fedlight.plugin.newcomers import Newcomers
    from fedlight.plugin.round_updates import RoundUpdates
    from fedlight.plugin.server import ServerContext

#: the models `evaluation_models` and `newcomer_models` give, one per group: a (groups, d) matrix of flat models, or
#: a sequence whose models are flat models or predictors of the algorithm's own (raw inputs -> logits or
#: log-probabilities, for what no single flat model predicts: a mixture of components)
GroupModels = Tensor | Sequence[Tensor | Callable[[Tensor], Tensor]]

#: the attributes one `Plan` replaced, refused on a class with the line that replaces them
FORMER_DECLARATIONS = ("holds_updates", "own_training", "corrects_gradient")
#: hooks that run only when the plan declares the matching field (checked when a subclass is defined)
DECLARED_BY = {"train_client": "own_training", "local_gradient": "corrects_gradient"}


@dataclass(frozen=True)
class Plan:
    """How the engine runs an algorithm's rounds, declared once on the class (`plan = Plan(holds_updates=True)`) and
    read by the engine at set-up: how a round streams and trains is declared, never inferred from the hooks a class
    overrides (those are only checked against it when the class is defined).

    Attributes:
        holds_updates: the aggregation hooks look at every update of a round at once (`updates.all()`); False: they
            stream them a group at a time (`updates.groups()`), so memory never holds every client's model.
        own_training: `train_client` is the algorithm's own local work that is not gradient descent (local k-means):
            clients then train one at a time. Gradient-based local work overrides `train_group` instead.
        corrects_gradient: `local_gradient` edits every client's flat gradient after each backward pass (FedProx's
            proximal term, SCAFFOLD's control variates).
    """

    holds_updates: bool = False
    own_training: bool = False
    corrects_gradient: bool = False


class Algorithm:
    """FedAvg, and the base class of every algorithm. Override only the hooks an algorithm changes.

    Args:
        participation: share of clients selected each round (at least one), drawn from a per-round stream
            that depends only on (seed, round), so resumed and uninterrupted runs select the same clients.
            An exact count is the federation's instead (`federation.clients_per_round`, read by `select_clients`
            from the server): the clients a round can reach are a property of the federation, not of the method,
            so every algorithm and plugin honours the count without an argument of its own
            (`fedlight.plugin.cohort`).
    """

    #: how the engine runs the rounds (`Plan`), declared once: e.g. `plan = Plan(holds_updates=True)`
    plan: ClassVar[Plan] = Plan()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in FORMER_DECLARATIONS:
            if name in vars(cls):
                raise TypeError(
                    f"{cls.__name__} sets `{name} = True`, which the class's plan replaced: write "
                    f"plan = Plan({name}=True)"
                )
        for hook, field_name in DECLARED_BY.items():
            if hook in vars(cls) and not getattr(cls.plan, field_name):
                raise TypeError(
                    f"{cls.__name__} overrides {hook}, which runs only when the plan declares it: write "
                    f"plan = Plan({field_name}=True)"
                )
        if "train_group" in vars(cls) and cls.plan.own_training:
            raise TypeError(
                f"{cls.__name__} overrides train_group but its plan declares own_training, under which "
                "clients run train_client one at a time: remove one of the two"
            )

    def __init__(self, participation: float = 1.0) -> None:
        if not 0 < participation <= 1:
            raise ValueError(f"participation must be in (0, 1], got {participation}")
        self.participation = participation
        self.models = torch.empty(0)
        self.assignment = torch.empty(0, dtype=torch.long)
        self.personal_mask: Tensor | None = None
        self.personal: ClientState | None = None
        self._personal_start: PersonalStart | None = None  # what clients never written read
        self._personal_generation = 0  # masks set so far: the store's name (`personal_part.store_name`)

    # -- hooks ---------------------------------------------------------------------------------------
    def extend_model(self, parts: "ModelParts") -> None:
        """Before set-up, before the module's tensors are laid out as the flat model: add the method's own modules
        with `parts.add(name, module)` (FedRoD's personal head, FedDBE's feature shift), sized from
        `parts.feature_size(method)` and `parts.num_classes`. They become entries of every client's flat model
        (`fedlight.plugin.model_parts`). Nothing by default."""

    def setup(self, server: "ServerContext") -> None:
        """Called once before the first round (and before a checkpoint is loaded): one global model, every
        client in cluster 0, nothing personal. Subclasses call `super().setup(server)` first."""
        self.server = server
        self.models = server.model.initial_params.unsqueeze(0).clone()
        self.assignment = torch.zeros(server.num_clients, dtype=torch.long, device=server.device)

    def begin_round(self, round: int) -> None:
        """The first step of every round, before any client is selected: one-time phases (FLIS-HC trains every
        client once and clusters them before its first round)."""

    def select_clients(self, round: int) -> list[int]:
        """The clients that train this round, sampled without replacement: exactly `federation.clients_per_round`
        when the run gives it, else a `participation` share, drawn by the run (`server.cohort.draw`: uniformly, or
        from the available clients by `system.selection`)."""
        n = self.server.num_clients
        return self.server.cohort.draw(round, Cohort(n, self.participation, self.server.cohort.clients_per_round).size)

    def train_group(self, round: int, clients: list[int], starts: Tensor) -> Trained:
        """The local work of a group of clients from their models `starts` (one row each): a `Trained` with the
        trained models (rows), each client's mean training loss and, in `state`, per-client tensors sent beside
        the models (a personal model, mixture weights: (len(clients), ...) each), which reach the aggregation hooks
        as `Updates.state`. Build it from `server.clients.train_many` calls (several for several models, each with its
        own gradient hook, trainable entries or sample weights) and `server.clients.group_batches` /
        `server.model.group_loss_and_grad` for a custom loop: the engine sizes the groups by memory and trains each
        call vectorized when the plan allows. This default is the module's SGD at `learning_rate_scale`, with
        `local_gradient` when the class corrects gradients."""
        return self.server.clients.train_many(
            round, clients, starts, lr_scale=self.learning_rate_scale(round), gradient_hook=self._gradient_hook(clients)
        )

    def _gradient_hook(self, clients: list[int]) -> GroupHook | None:
        """`local_gradient` as a hook of `train_many` over `clients` (None when the class does not correct)."""
        if not self.plan.corrects_gradient:
            return None

        def hook(rows: list[int], params: Tensor, grad: Tensor, starts: Tensor) -> None:
            for i, row in enumerate(rows):
                self.local_gradient(clients[row], params[i], grad[i], starts[i])

        return hook

    def train_client(
        self, round: int, client: int, start: Tensor
    ) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One client's own local work from its model `start`: (trained flat model, mean training loss), optionally
        with a third element, a dict of tensors the client sends beside its model (its personal model, its control
        variate), which reaches the aggregation hooks as `Updates.state`, gathered over the processes like the
        model. Called only when the plan declares `own_training` (its clients then train one after another);
        otherwise clients run the module's own `training_step` and optimizer, possibly vectorized, shaped by
        `learning_rate_scale` and `local_gradient`. This default is that SGD, for an override to build on."""
        hook = None
        if self.plan.corrects_gradient:
            hook = lambda params, grad, begin: self.local_gradient(client, params, grad, begin)  # noqa: E731
        trained = self.server.clients.train(
            round, client, start, lr_scale=self.learning_rate_scale(round), gradient_hook=hook
        )
        return trained.params, trained.loss

    def learning_rate_scale(self, round: int) -> float:
        """Factor on the clients' configured learning rate in this round (a server-side schedule); 1 here."""
        return 1.0

    def local_gradient(self, client: int, params: Tensor, grad: Tensor, start: Tensor) -> None:
        """Change the local objective by editing the flat gradient `grad` in place after every backward pass
        (FedProx's proximal term). `params` is the current flat model, `start` the one training began from.
        Called only when the plan declares `corrects_gradient`."""

    def pre_aggregation(self, round: int, updates: "RoundUpdates") -> None:
        """Look at the round's updates before they are combined: cluster clients, fire triggers (an algorithm
        that reads them here declares `plan = Plan(holds_updates=True)`)."""

    def aggregate(self, round: int, updates: "RoundUpdates") -> None:
        """FedAvg within each cluster: the shared part of every cluster model with members in `updates` becomes
        their training-set-size weighted mean; each client keeps its trained personal part. Streamed, the sums
        run over one group at a time and are added over the processes once. The combination is the engine's
        cluster aggregator (`ServerContext.aggregation.new`): the weighted mean unless the run configures a
        robust rule or differential privacy."""
        models, mask = self.models, self.personal_mask
        average = self.server.aggregation.new(len(models), models.shape[1], models.dtype, models.device, mask)
        width = 0 if mask is None else int(mask.sum())
        ids, rows = [models.new_zeros(0, dtype=torch.long)], [models.new_zeros(0, width)]  # personal parts trained
        for group in updates.groups():
            average.add(self.assignment[group.clients], group.num_samples.to(models.dtype), group.params, group.starts)
            if mask is not None:
                ids.append(group.clients)
                rows.append(group.params[:, mask])
            del group  # or it would stay alive while the next group trains: two groups in memory
        average.reduce(updates)
        if mask is not None:
            assert self.personal is not None  # set with the mask
            trained = updates.cat_over_processes(torch.cat(ids))
            self.personal.write(trained, updates.cat_over_processes(torch.cat(rows)))  # the trained clients' rows only
        self.set_shared(*average.means())

    def post_aggregation(self, round: int, updates: "RoundUpdates") -> None:
        """After the updates are combined: reassign clients to the new models, schedules, bookkeeping."""

    def evaluation_models(self) -> tuple[GroupModels, Tensor]:
        """(models, group of each client): the clients of a group share one model, so the engine runs each model
        once over its clients' data. With personal parts, every client is its own group and its model is built
        when asked for (`client_model`: one row of the personal store read at a time, never every client's at once).
        A model may also be a callable predictor of the algorithm's own (raw inputs -> logits or log-probabilities),
        for predictions no single flat model gives (a mixture of components). When the personal entries all lie in
        the head, the models say so (`SharedBodyModels`): the engine runs each cluster's body once over its
        clients' rows and each client's head on their features."""
        if self.personal_mask is None:
            return self.models, self.assignment
        n, mask = self.server.num_clients, self.personal_mask
        clients = torch.arange(n, device=self.server.device)
        head = self.server.model.last_layer_mask()
        if not bool(head.any()) or not personal_heads(mask, head):
            return ClientModels(self.client_model, n), clients
        assert self.personal is not None  # set with the mask
        personal = self.personal
        models = SharedBodyModels(
            self.client_model, n, self.models, self.assignment, mask.nonzero().flatten(), lambda c: personal[c]
        )
        return models, clients

    def newcomer_models(self, newcomers: "Newcomers") -> tuple[GroupModels, Tensor, Tensor | None]:
        """(models, model of each newcomer, cluster of each newcomer or None) for clients held out of training
        (`fedlight.plugin.newcomers`), as `evaluation_models` gives models and groups; the clusters, in the labels
        of `cluster_labels()`, are scored with the training clients' against the true clusters (`unseen/ari`) when
        the algorithm clusters. Called at every evaluation, on every process. This default picks, for
        each newcomer, the cluster model with the lowest loss on its training split (one model: the global one, as
        FedAvg deploys it), with the personal entries reset to the initial model's (a fresh personal part, which
        `federation.finetune_epochs` then trains)."""
        models = self.models
        if self.personal_mask is not None:  # the losses are those of the models the newcomers get
            models = torch.where(self.personal_mask, self.server.model.initial_params, models)
        if len(models) == 1:
            groups = torch.zeros(newcomers.count, dtype=torch.long, device=models.device)
        else:
            groups = torch.nan_to_num(newcomers.losses(models), nan=math.inf).argmin(dim=0)
        return models, groups, (groups if self.cluster_labels() is not None else None)

    def cluster_labels(self) -> np.ndarray | None:
        """Each client's current cluster, to log and to score against the true clusters; None when the
        algorithm does not cluster."""
        return None

    def round_metrics(self) -> dict[str, float]:
        """Scalars describing the state after the round (a threshold, the round the clusters formed); what a
        command computes on the way is recorded with `log` (and matrices with `log_matrix`) as it acts."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything that must survive a restart. Subclasses add their own keys with `super()`. The personal rows
        are the engine's (a client state, checkpointed with the federation); here are the mask, the start rows of
        the clients never written and the mask's generation, which names the store."""
        start = self._personal_start
        return {
            "models": self.models,
            "assignment": self.assignment,
            "personal_mask": self.personal_mask,
            "personal_start": None if start is None else start.rows,
            "personal_start_group": None if start is None else start.group,
            "personal_generation": torch.tensor(self._personal_generation),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state of `state_dict`; the personal store is declared again under its saved name, for the
        engine to load its rows into."""
        self.models = state["models"]
        self.assignment = state["assignment"]
        if self.personal is not None:
            self.server.state.drop(self.personal.name)
        self.personal_mask, self.personal, self._personal_start = state["personal_mask"], None, None
        self._personal_generation = int(state["personal_generation"])
        if self.personal_mask is not None:
            self._personal_start = PersonalStart(state["personal_start"], state["personal_start_group"])
            self.personal = self.server.state.declare(store_name(self._personal_generation), self._personal_start)

    # -- logging -----------------------------------------------------------------------------------------------
    def log(self, name: str, value: float | Tensor) -> None:
        """Record a scalar of this round (metrics.csv, the console, W&B), as LightningModule.log does; a name
        logged twice in a round keeps the later value."""
        self.server.log.scalar(name, value)

    def log_matrix(self, name: str, matrix: np.ndarray | Tensor) -> None:
        """Record a client-by-client matrix of this round: saved in the run folder as matrices/<name>_roundNNNN.npy
        and shown as a heatmap in W&B (a name ending in its kind, `_cosine_distance` or `_similarity`, fixes the
        colour scale)."""
        self.server.log.matrix(name, matrix)

    # -- services on the state -----------------------------------------------------------------------------
    def client_model(self, client: int) -> Tensor:
        """A client's flat model: its cluster's model with its personal part written in. Clients start local
        training from it."""
        model = self.models[self.assignment[client]]
        if self.personal_mask is None:
            return model
        assert self.personal is not None  # set with the mask
        model = model.clone()
        model[self.personal_mask] = self.personal[client]  # one stored row, or the client's start row
        return model

    def cluster_means(
        self, updates: Updates, weights: Tensor, values: Tensor | Differences | None = None
    ) -> tuple[Tensor, Tensor]:
        """(clusters with a member in `updates`, weighted mean of their members' `values`), as one matrix product
        over a weighted membership matrix. `values` defaults to the trained models (then measured from the
        clients' starts); given values (updates) are combined as they are: `updates.delta_rows()` gives the updates
        without building them whole (the mean builds a chunk of rows at a time). The combination is the engine's cluster
        aggregator, as in `aggregate`: a robust rule or DP's noised mean when the run configures one."""
        starts = updates.starts if values is None else None
        values = updates.params if values is None else values
        average = self.server.aggregation.new(
            len(self.models), values.shape[1], values.dtype, values.device, self.personal_mask
        )
        average.add(self.assignment[updates.clients], weights, values, starts)
        return average.means()

    def set_shared(self, clusters: Tensor, values: Tensor) -> None:
        """Write `values` into the shared (non-personal) entries of the given cluster models."""
        if self.personal_mask is None:
            self.models[clusters] = values
        else:
            self.models[clusters] = torch.where(~self.personal_mask, values, self.models[clusters])

    def set_personal_mask(self, mask: Tensor | None, updates: Updates | None = None) -> None:
        """Make the entries where `mask` is True the personal part from now on (a fixed set of layers from
        `server.model.layer_mask`/`layer_count_mask`, or a schedule), re-slicing every client's stored personal
        values. A mask with no True entry, or None, makes everything shared.

        An entry that becomes personal starts, for a client in `updates`, from its trained value there, and for
        every other client from its current model. An entry that stops being personal is set, in each cluster
        model, to the training-set-size weighted mean of its members' personal values. The rows move to a new
        store (`fedlight.plugin.personal_part`): only the clients with a stored row, or in `updates`, get one there,
        a chunk at a time; the others read start rows, one per cluster (and earlier start row)."""
        device = self.models.device
        new = None if mask is None or not bool(mask.any()) else mask.to(device=device, dtype=torch.bool)
        nothing = torch.zeros(self.models.shape[1], dtype=torch.bool, device=device)
        old_m = nothing if self.personal_mask is None else self.personal_mask
        new_m = nothing if new is None else new
        leaving = old_m & ~new_m
        old, old_start = self.personal, self._personal_start
        if leaving.any():
            assert old is not None and old_start is not None  # set with the mask
            active, means = leaving_means(
                old, old_start, self.assignment, self.server.clients.train_sizes, leaving[old_m], len(self.models)
            )
            rows = self.models[active]
            rows[:, leaving] = means
            self.models[active] = rows
        if old is not None:
            self.server.state.drop(old.name)  # still read below; its budget goes to the new store
        self.personal_mask, self.personal, self._personal_start = new, None, None
        if new is None:
            return
        kept, from_old = old_m[new], new[old_m]
        cluster_values = self.models[:, new]  # shared until now: the cluster model's values
        start = (
            PersonalStart.first(cluster_values, self.assignment)
            if old_start is None
            else old_start.resliced(cluster_values, self.assignment, kept, from_old)
        )
        self._personal_generation += 1
        self.personal = self.server.state.declare(store_name(self._personal_generation), start)
        self._personal_start = start
        reslice(old, self.personal, cluster_values, self.assignment, kept, from_old, updates, new)
