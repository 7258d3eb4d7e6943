"""The federated loop: each round, select clients, train them on the shared module (vectorized where possible),
hand their updates to the algorithm, and evaluate every client's own model (docs/architecture.md, "The round as
data flow").

Every random choice is a pure function of (seed, round, client, purpose), so a run resumed from a round
checkpoint repeats exactly what the uninterrupted run does, and the order clients are trained in does not
matter.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
from lightning.fabric.utilities.apply_func import move_data_to_device
import numpy as np
import torch
from torch import Tensor

from fedlight.aggregation import average_in_clusters
from fedlight.algorithm import Algorithm
from fedlight.cluster.scores import clustering_scores
from fedlight.data import ClientDataModule, FederatedData
from fedlight.setup import (FederationConfig, available_memory, batch_transform, check_evaluation_split,
                            default_precision, load_clients, make_fabric)
from fedlight.distributed import Collective, gather_logs
from fedlight.evaluation import per_client_classification, summarize
from fedlight.flat import FlatModel
from fedlight.probe import ProbeResult, probe
from fedlight.server import ServerContext
from fedlight.training_stats import TrainingStats
from fedlight.updates import Updates
from fedlight.vectorized import VectorizedTrainer, unsupported_reason
from fedlight.worker import ClientTrainer


CPU_GROUP = 256  # most clients per group on a CPU: plenty for full-width vectorized steps


def finite_updates(updates: Updates, left_out: list[int]) -> Updates:
    """The updates whose trained model and training loss are finite; the clients of the others are appended to
    `left_out` (a NaN in a client's data or an exploding loss must not poison a cluster's average)."""
    finite = torch.isfinite(updates.params).all(dim=1) & torch.isfinite(updates.train_loss)
    if bool(finite.all()):
        return updates
    left_out.extend(updates.clients[~finite].tolist())
    return updates.subset(finite)


class Federation:
    """One federated run in memory: data on the device, one module, an algorithm, and the round loop."""

    def __init__(self, data: ClientDataModule, model: L.LightningModule, algorithm: Algorithm | None = None,
                 config: FederationConfig | None = None, seed: int = 0) -> None:
        self.config = config or FederationConfig()
        self.seed = seed
        self.algorithm = algorithm if algorithm is not None else Algorithm()
        precision = self.config.precision or default_precision(self.config.accelerator)
        self.fabric = make_fabric(self.config, precision)
        self.collective = Collective(self.fabric)
        self.precision = precision
        self.data: FederatedData = load_clients(data, seed).to(self.device)
        self.transform = batch_transform(data.on_after_batch_transfer, self.fabric)
        self.module = model
        self.fabric.setup_module(model)
        model._fabric = None  # per-step self.log through Fabric would sync the device; training logs per round
        self.flat = FlatModel(model)
        self.trainer = ClientTrainer(self.fabric, model, self.flat, self.transform, self.config.batch_size,
                                     self.config.local_epochs)
        self.vectorized_reason: str | None = None  # why clients train one after another, when they do
        self.vectorized = self._vectorized_trainer(model)
        self.probe_result: ProbeResult | None = None  # what `vectorize: -1` measured and chose
        check_evaluation_split(self.data.split(self.config.eval_split).sizes(), self.config.eval_split)
        self.server = ServerContext(self.data, model, self.flat, self.trainer, self.fabric, self.transform, seed,
                                    self.config.rounds, self.config.eval_split, self.config.eval_batch_size)
        self.round = 0
        self.algorithm.setup(self.server)

    @property
    def device(self) -> torch.device:
        return self.fabric.device

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    # -- one round ---------------------------------------------------------------------------------
    def train_clients(self, round: int, clients: list[int]) -> Updates:
        """Local training of the selected clients: one after another on the shared module, or in groups
        through the vectorized trainer when it is on and the algorithm keeps the default local training."""
        alg = self.algorithm
        starts = torch.stack([alg.client_model(c) for c in clients])
        vectorized = None
        if self.vectorized is not None and type(alg).train_client is Algorithm.train_client:
            vectorized = self._try_vectorized(round, clients, starts)
        if vectorized is not None:
            params, losses, logs = vectorized
        else:  # written in place, so the trained models are never held twice
            params, losses = torch.empty_like(starts), torch.empty(len(clients), device=self.device)
            logs: dict[str, Tensor] = {}
            for row, (client, start) in enumerate(zip(clients, starts)):
                self.trainer.last_logs = {}
                params[row], losses[row] = alg.train_client(round, client, start)
                for name, value in self.trainer.last_logs.items():
                    logs.setdefault(name, torch.full((len(clients),), float("nan"), device=self.device))[row] = value
        ids = torch.tensor(clients, device=self.device)
        return Updates(ids, params, starts, self.server.train_sizes[ids], losses, logs)

    def train_groups(self, round: int, clients: list[int]) -> Iterator[Updates]:
        """`train_clients` a group at a time (groups of `_group_size`): for aggregation by running sums, so
        that a round never holds more than one group's models."""
        size = self._group_size(len(clients))
        for begin in range(0, len(clients), size):
            yield self.train_clients(round, clients[begin: begin + size])

    def _try_vectorized(self, round: int, clients: list[int], starts: Tensor) -> tuple[Tensor, Tensor, dict] | None:
        """Vectorized training, or None (and sequential training from then on) when the module's training
        step fails under torch.func, e.g. because it reads values back with .item()."""
        try:
            if self.config.vectorize == -1 and self.probe_result is None:
                self._probe(round, clients, starts)
                if self.vectorized is None:
                    return None
            return self._train_vectorized(round, clients, starts)
        except Exception as error:  # any failure inside vmap: the module is not vectorizable
            self.vectorized_reason = f"training_step failed under torch.func ({error!r})"
            warnings.warn(f"vectorized training is off: {self.vectorized_reason}; clients train one after another",
                          stacklevel=2)
            self.vectorized = None
            return None

    def _probe(self, round: int, clients: list[int], starts: Tensor) -> None:
        """Time both trainers on this round's first group (`fedlight.probe`) and keep the faster."""
        alg = self.algorithm
        group = clients[: self._group_size(len(clients))]
        seeds = [self.server.client_seed(round, c) for c in group]
        lr_scale = alg.learning_rate_scale(round)

        def sequential(rows: Tensor, data: list[tuple[Tensor, Tensor]]) -> Tensor:
            return torch.stack([self.trainer.fit(start, x, y, seed, self._gradient_hook(c), lr_scale, epochs=1,
                                                 round=round)[0]
                                for start, (x, y), seed, c in zip(rows, data, seeds, group)])

        def vectorized(rows: Tensor, data: list[tuple[Tensor, Tensor]]) -> Tensor:
            return self.vectorized.fit_many(rows, data, seeds[: len(rows)], self._row_hook(group), lr_scale, round,
                                            epochs=1)[0]

        data = [self.data.train.client(c) for c in group]
        result = probe(starts[: len(group)], data, self.config.batch_size, sequential, vectorized, self.device)
        self.probe_result = self.collective.broadcast(result)  # every process trains the way the first chose
        if self.probe_result.choice == "sequential":
            self.vectorized, self.vectorized_reason = None, self.probe_result.reason

    def _gradient_hook(self, client: int) -> Callable | None:
        """The algorithm's gradient correction for one client's sequential training (None without one)."""
        alg = self.algorithm
        if type(alg).local_gradient is Algorithm.local_gradient:
            return None
        return lambda params, grad, start: alg.local_gradient(client, params, grad, start)

    def _row_hook(self, group: list[int]) -> Callable | None:
        """The same for the rows of a vectorized group."""
        alg = self.algorithm
        if type(alg).local_gradient is Algorithm.local_gradient:
            return None
        return lambda row, params, grad, start: alg.local_gradient(group[row], params, grad, start)

    def _train_vectorized(self, round: int, clients: list[int], starts: Tensor) -> tuple[Tensor, Tensor, dict]:
        alg = self.algorithm
        size = self._group_size(len(clients))
        params, losses, logs = [], [], []
        for begin in range(0, len(clients), size):
            group = clients[begin: begin + size]
            trained, loss = self.vectorized.fit_many(
                starts[begin: begin + size], [self.data.train.client(c) for c in group],
                [self.server.client_seed(round, c) for c in group], self._row_hook(group),
                lr_scale=alg.learning_rate_scale(round), round=round)
            params.append(trained)
            losses.append(loss)
            logs.append(self.vectorized.last_logs)
        names = dict.fromkeys(name for part in logs for name in part)
        return torch.cat(params), torch.cat(losses), {name: torch.cat([part[name] for part in logs]) for name in names}

    def _group_size(self, clients: int) -> int:
        """Clients trained (vectorized) or aggregated together: `vectorize` when it is a count; otherwise as
        many as half the free memory holds (on a CPU also at most `CPU_GROUP`)."""
        if self.config.vectorize > 0:
            return self.config.vectorize
        per_client = self.flat.numel * self.flat.vector.element_size() * 8  # params, grads, state, temporaries
        free = available_memory(self.device)
        fits = clients if free is None else max(1, int(0.5 * free // per_client))
        return min(clients, fits) if self.device.type == "cuda" else min(clients, fits, CPU_GROUP)

    def _vectorized_trainer(self, model: L.LightningModule) -> VectorizedTrainer | None:
        if not self.config.vectorize:
            self.vectorized_reason = "federation.vectorize is 0"
            return None
        if type(self.algorithm).train_client is not Algorithm.train_client:
            self.vectorized_reason = f"{type(self.algorithm).__name__} trains its clients itself (train_client)"
            return None
        reason = unsupported_reason(model, self.trainer.raw_optimizer, self.trainer.scaler)
        if reason:
            self.vectorized_reason = reason
            warnings.warn(f"vectorized training is off: {reason}; clients train one after another", stacklevel=2)
            return None
        return VectorizedTrainer(self.fabric, model, self.flat, self.trainer.raw_optimizer,
                                 self.trainer.learning_rates, self.transform, self.config.batch_size,
                                 self.config.local_epochs)

    def run_round(self, round: int) -> dict[str, Any]:
        """Run round `round` (1-based) and return its metrics, with per-client values under 'clients' (and
        `client_facts`) when it was evaluated, and the algorithm's matrices under 'matrices'."""
        alg = self.algorithm
        alg.begin_round(round)
        clients = alg.select_clients(round)
        mine = self.collective.shard(clients)  # every client, unless the round is spread over processes
        left_out: list[int] = []
        stats = TrainingStats(self.num_clients)
        if self.aggregates_in_groups():
            average_in_clusters(alg, (stats.add(finite_updates(u, left_out)) for u in self.train_groups(round, mine)),
                                self.collective)
            stats.share(self.collective)
        else:
            updates = self.gather_updates(finite_updates(self.train_clients(round, mine), left_out), clients)
            stats.add(updates)
            if len(updates):
                alg.pre_aggregation(round, updates)
                alg.aggregate(round, updates)
        alg.post_aggregation(round)
        left_out = [c for part in self.collective.gather_objects(left_out) for c in part]
        self.round = round
        metrics: dict[str, Any] = {"round": round, "clients_trained": len(clients),
                                   "clients_left_out": len(left_out), "left_out": sorted(left_out),
                                   **stats.metrics()}
        if type(alg).train_client is Algorithm.train_client:  # clients run SGD at the module's learning rate
            metrics["train/lr"] = self.trainer.learning_rates.round_rate(round) * alg.learning_rate_scale(round)
        metrics.update(alg.round_metrics())
        clusters = alg.cluster_labels()
        metrics.update(self.score_clusters(clusters))
        if round % self.config.eval_every == 0 or round == self.config.rounds:
            metrics.update(self.evaluate())
            metrics["clients"].update(stats.per_client())
            metrics["clients"].update(self.client_facts(clusters))
        matrices = alg.round_matrices()
        if matrices:
            metrics["matrices"] = matrices
        return metrics

    def gather_updates(self, updates: Updates, clients: list[int]) -> Updates:
        """Every process's updates, in the order of `clients` (the single-process order); `updates` itself when
        one process trains every client."""
        collective = self.collective
        if not collective.spread:
            return updates
        position = torch.full((self.num_clients,), -1, dtype=torch.long, device=self.device)
        position[torch.tensor(clients, device=self.device)] = torch.arange(len(clients), device=self.device)
        ids = collective.gather(updates.clients)
        columns = [collective.gather(t) for t in (updates.params, updates.starts, updates.num_samples,
                                                   updates.train_loss)]
        logs = gather_logs(collective, updates.logs, len(updates), self.device)
        order = position[ids].argsort()
        return Updates(ids[order], *(c[order] for c in columns), {k: v[order] for k, v in logs.items()})

    def client_facts(self, clusters: np.ndarray | None) -> dict[str, np.ndarray]:
        """What is recorded of each client beside its metrics: the cluster it was evaluated in (when the
        algorithm clusters), its true cluster (when the split defines one) and its training-set size."""
        facts = {} if clusters is None else {"cluster": np.asarray(clusters)}
        if self.data.cluster_labels is not None:
            facts["true_cluster"] = np.asarray(self.data.cluster_labels)
        facts["samples"] = self.server.train_sizes.cpu().numpy()
        return facts

    def aggregates_in_groups(self) -> bool:
        """True when the algorithm keeps FedAvg's aggregation (it overrides neither `pre_aggregation` nor
        `aggregate`): its updates can then be averaged as running sums, a group of clients at a time."""
        cls = type(self.algorithm)
        return cls.pre_aggregation is Algorithm.pre_aggregation and cls.aggregate is Algorithm.aggregate

    def score_clusters(self, predicted: np.ndarray | None) -> dict[str, float]:
        """A client clustering against the split's true clusters (when both exist)."""
        if predicted is None:
            return {}
        scores = {"cluster/count": float(len(np.unique(predicted)))}
        if self.data.cluster_labels is not None:
            scores.update({f"cluster/{k}": v for k, v in clustering_scores(self.data.cluster_labels, predicted).items()})
        return scores

    @torch.no_grad()
    def evaluate(self, split: str | None = None) -> dict[str, Any]:
        """Every client's own model on its split: summaries across clients, plus per-client values. Spread over
        processes, each evaluates every `world`-th client and the per-client values are gathered."""
        split = split or self.config.eval_split
        data, client_of_row = self.data.split(split), self.server.client_of_row(split)
        x, y = data.x, data.y
        collective = self.collective
        if collective.spread:
            mine = (client_of_row % collective.world == collective.rank).nonzero().flatten()
            x, y, client_of_row = x[mine], y[mine], client_of_row[mine]
        models, group_of_client = self.algorithm.evaluation_models()
        group_of_row = group_of_client[client_of_row]
        order = torch.argsort(group_of_row, stable=True)
        counts = torch.bincount(group_of_row, minlength=len(models)).tolist()
        outputs: Tensor | None = None
        begin = 0
        for group, count in enumerate(counts):
            if count:
                rows = order[begin: begin + count]
                out = self.server.predict(models[group], x[rows])
                if outputs is None:
                    outputs = out.new_empty((len(order), *out.shape[1:]))
                outputs[rows] = out
                begin += count
        if outputs is None:  # no row to evaluate on this process
            outputs = self.server.predict(models[0], x[:0])
        metric_fn = getattr(self.module, "client_metrics", None)
        if metric_fn is not None:
            per_client = metric_fn(outputs, y, client_of_row, self.num_clients)
        else:
            per_client = per_client_classification(outputs, y, client_of_row, self.num_clients, self.data.num_classes)
        if collective.spread:  # each client's values from the process that evaluated it
            owner = torch.arange(self.num_clients, device=self.device) % collective.world
            per_client = {k: collective.stack(v)[owner, torch.arange(self.num_clients, device=self.device)]
                          for k, v in per_client.items()}
        values = {k: v.cpu().numpy() if v.is_floating_point() else v.cpu().double().numpy()
                  for k, v in per_client.items()}
        empty = data.sizes() == 0
        for v in values.values():
            v[empty] = np.nan  # a client with nothing to evaluate has no value, and is left out of the means
        return {**summarize(values, split), "clients": values}

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        probe = None if self.probe_result is None else self.probe_result.as_dict()
        return {"round": self.round, "algorithm": self.algorithm.state_dict(), "probe": probe}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = state["round"]
        self.algorithm.load_state_dict(move_data_to_device(state["algorithm"], self.device))
        if state.get("probe") is not None and self.config.vectorize == -1:  # the resumed run keeps its choice
            self.probe_result = ProbeResult(**state["probe"])
            if self.probe_result.choice == "sequential":
                self.vectorized, self.vectorized_reason = None, self.probe_result.reason
