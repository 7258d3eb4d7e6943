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
from dataclasses import dataclass
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
from fedlight.evaluation import per_client_classification, summarize
from fedlight.flat import FlatModel
from fedlight.probe import ProbeResult, probe
from fedlight.server import ServerContext
from fedlight.training_stats import TrainingStats
from fedlight.updates import Updates
from fedlight.vectorized import VectorizedTrainer, unsupported_reason
from fedlight.worker import ClientTrainer


CPU_GROUP = 256  # most clients per group on a CPU: plenty for full-width vectorized steps
SMALL_EVALUATION = 10  # below this many evaluation samples per client, per-client accuracy is noise


@dataclass
class FederationConfig:
    """How the federation runs.

    Args:
        rounds: communication rounds.
        local_epochs: passes over its training data each selected client makes per round.
        batch_size: local mini-batch size.
        accelerator: "auto", "cpu", "cuda", ... (Lightning Fabric's names).
        precision: Fabric precision; None picks bf16-mixed (or 16-mixed) on a GPU and 32-true on a CPU.
        eval_every: evaluate every client's model every this many rounds (and always after the last).
        eval_split: the per-client split evaluated ("test", "val", or "train" for methods such as data
            clustering that are scored on the data they fit).
        eval_batch_size: rows per forward pass during evaluation and inference.
        vectorize: train this many clients at once through torch.func (0 = one after another; -1 = auto: as
            many as half the free memory holds, on a CPU at most 256). Modules that
            cannot be vectorized (BatchNorm in training mode, other optimizers) fall back to sequential
            training. An algorithm that aggregates by running sums (FedAvg, FedProx, FedPer, ...) also
            receives the updates in groups of this size, so memory does not grow with clients x parameters.
    """

    rounds: int = 20
    local_epochs: int = 1
    batch_size: int = 32
    accelerator: str = "auto"
    precision: str | None = None
    eval_every: int = 1
    eval_split: str = "test"
    eval_batch_size: int = 4096
    vectorize: int = -1

    def __post_init__(self) -> None:
        for name in ("rounds", "local_epochs", "batch_size", "eval_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"federation.{name} must be at least 1, got {getattr(self, name)}")
        if self.vectorize < -1:
            raise ValueError(f"federation.vectorize must be -1 (auto), 0 (off) or a client count, got {self.vectorize}")
        if self.eval_split not in ("test", "val", "train"):
            raise ValueError(f"federation.eval_split must be 'test', 'val' or 'train', got {self.eval_split!r}")


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on `device`: the GPU's free memory, or the host's available memory
    (Linux's MemAvailable); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def make_fabric(accelerator: str, precision: str) -> L.Fabric:
    """A one-device Fabric, or a one-line error naming the setting when this machine cannot honour it."""
    if accelerator in ("cuda", "gpu") and not torch.cuda.is_available():
        raise ValueError(f"federation.accelerator={accelerator}, but this machine has no usable CUDA GPU "
                         "(torch.cuda.is_available() is False): use --federation.accelerator cpu, or auto to take a "
                         "GPU where there is one")
    try:
        return L.Fabric(accelerator=accelerator, devices=1, precision=precision)
    except (RuntimeError, ValueError) as error:  # Lightning's MisconfigurationException is a RuntimeError
        raise ValueError(f"federation.accelerator={accelerator}, federation.precision={precision}: "
                         f"{str(error).splitlines()[0]}") from None


def default_precision(accelerator: str) -> str:
    if accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available()):
        return "32-true"
    return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"


def batch_transform(on_after_batch_transfer: Callable, fabric: L.Fabric) -> Callable:
    """The data module's on-device conversion followed by the precision's input conversion (bf16-true and
    16-true models take their floating inputs in that dtype)."""
    convert = fabric.strategy.precision.convert_input

    def transform(batch: Any, dataloader_idx: int = 0) -> Any:
        return convert(on_after_batch_transfer(batch, dataloader_idx))

    return transform


def load_clients(data: ClientDataModule, seed: int) -> FederatedData:
    """Prepare and set up a data module for `seed` and return its clients (checked against the contract)."""
    if not isinstance(data, ClientDataModule):
        raise ValueError(f"{type(data).__name__} is not a federated data module: subclass "
                        "fedlight.datamodules.FederatedDataModule (or provide seed, federated, prepare_data, setup "
                        "and on_after_batch_transfer)")
    data.seed = seed
    data.prepare_data()
    data.setup("fit")
    if not isinstance(data.federated, FederatedData):
        raise ValueError(f"{type(data).__name__}.setup() left no FederatedData in `federated`")
    return data.federated


def finite_updates(updates: Updates, left_out: list[int]) -> Updates:
    """The updates whose trained model and training loss are finite; the clients of the others are appended to
    `left_out` (a NaN in a client's data or an exploding loss must not poison a cluster's average)."""
    finite = torch.isfinite(updates.params).all(dim=1) & torch.isfinite(updates.train_loss)
    if bool(finite.all()):
        return updates
    left_out.extend(updates.clients[~finite].tolist())
    return updates.subset(finite)


def check_evaluation_split(sizes: np.ndarray, split: str) -> None:
    """Refuse a split with no sample at all; warn when some clients have none (they are left out of the means)
    or when most have so few that their accuracy is noise."""
    fix = (f"give the clients more samples or raise the data module's {split}_fraction" if split != "train" else
           "give the clients more samples")
    if sizes.sum() == 0:
        raise ValueError(f"federation.eval_split={split!r}, but no client has a sample in that split: {fix}, or "
                         "evaluate on eval_split='train'")
    empty = int((sizes == 0).sum())
    if empty:
        warnings.warn(f"{empty} of {len(sizes)} clients have no {split!r} samples: they are left out of the {split} "
                      f"means and their per-client values are empty ({fix})", stacklevel=3)
    if np.median(sizes) < SMALL_EVALUATION:
        warnings.warn(f"most clients have fewer than {SMALL_EVALUATION} {split!r} samples (median "
                      f"{float(np.median(sizes)):g}): their accuracy is noise ({fix})", stacklevel=3)


class Federation:
    """One federated run in memory: data on the device, one module, an algorithm, and the round loop."""

    def __init__(self, data: ClientDataModule, model: L.LightningModule, algorithm: Algorithm | None = None,
                 config: FederationConfig | None = None, seed: int = 0) -> None:
        self.config = config or FederationConfig()
        self.seed = seed
        self.algorithm = algorithm if algorithm is not None else Algorithm()
        precision = self.config.precision or default_precision(self.config.accelerator)
        self.fabric = make_fabric(self.config.accelerator, precision)
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
        self.probe_result = probe(starts[: len(group)], data, self.config.batch_size, sequential, vectorized,
                                  self.device)
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
        left_out: list[int] = []
        stats = TrainingStats(self.num_clients)
        if self.aggregates_in_groups():
            average_in_clusters(alg, (stats.add(finite_updates(u, left_out)) for u in self.train_groups(round, clients)))
        else:
            updates = stats.add(finite_updates(self.train_clients(round, clients), left_out))
            if len(updates):
                alg.pre_aggregation(round, updates)
                alg.aggregate(round, updates)
        alg.post_aggregation(round)
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
        """Every client's own model on its split: summaries across clients, plus per-client values."""
        split = split or self.config.eval_split
        data, client_of_row = self.data.split(split), self.server.client_of_row(split)
        models, group_of_client = self.algorithm.evaluation_models()
        group_of_row = group_of_client[client_of_row]
        order = torch.argsort(group_of_row, stable=True)
        counts = torch.bincount(group_of_row, minlength=len(models)).tolist()
        outputs: Tensor | None = None
        begin = 0
        for group, count in enumerate(counts):
            if count:
                rows = order[begin: begin + count]
                out = self.server.predict(models[group], data.x[rows])
                if outputs is None:
                    outputs = out.new_empty((len(order), *out.shape[1:]))
                outputs[rows] = out
                begin += count
        metric_fn = getattr(self.module, "client_metrics", None)
        if metric_fn is not None:
            per_client = metric_fn(outputs, data.y, client_of_row, self.num_clients)
        else:
            per_client = per_client_classification(outputs, data.y, client_of_row, self.num_clients,
                                                   self.data.num_classes)
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
