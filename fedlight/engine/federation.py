"""The federated loop: each round is the algorithm's story, select -> train -> pre_aggregation -> aggregate ->
post_aggregation -> evaluate (docs/architecture.md, "The round as data flow"). How clients train and where
(groups, trainers, processes) is `fedlight.engine.execution`'s; evaluation is `fedlight.engine.evaluator`'s; the
per-client state the algorithm declares is `fedlight.engine.client_state`'s, written after `post_aggregation`.

Every random choice is a pure function of (seed, round, client, purpose), so a run resumed from a round
checkpoint repeats exactly what the uninterrupted run does, and the order clients are trained in does not
matter.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from fedlight.engine.algorithm import Algorithm
from fedlight.engine.attacks import Attack, AttackConfig
from fedlight.engine.client_state import ClientStates
from fedlight.engine.cluster_aggregator import (ClusterAggregation, RobustSettings, check_aggregation,
                                                clients_per_round)
from fedlight.engine.config import FederationConfig
from fedlight.engine.data import ClientDataModule, FederatedData, check_evaluation_split, load_clients
from fedlight.engine.devices import batch_transform, client_state_budget, default_precision, make_fabric
from fedlight.engine.evaluation import UNSEEN, per_cluster_means
from fedlight.engine.evaluator import Evaluator
from fedlight.engine.newcomers import HeldOutClients
from fedlight.engine.execution import ClientExecution
from fedlight.engine.privacy import PrivacyConfig, PrivacyMechanism
from fedlight.engine.processes import Collective
from fedlight.engine.round_result import RoundResult
from fedlight.engine.round_updates import TrainingReport
from fedlight.engine.server import ServerContext, stream_seed
from fedlight.engine.threads import use_threads
from fedlight.training.flat import FlatModel
from fedlight.training.sequential import ClientTrainer


class Federation:
    """One federated run in memory: data on the device, one module, an algorithm, and the round loop.

    `attack` makes a share of the clients malicious (`fedlight.engine.attacks`); `privacy` turns on client-level DP
    (`fedlight.engine.privacy`); `config.aggregator` picks the rule that combines each cluster's updates
    (`fedlight.engine.cluster_aggregator`). None of them changes anything when left at its default."""

    def __init__(self, data: ClientDataModule, model: L.LightningModule, algorithm: Algorithm | None = None,
                 config: FederationConfig | None = None, seed: int = 0, attack: AttackConfig | None = None,
                 privacy: PrivacyConfig | None = None) -> None:
        self.config = config or FederationConfig()
        self.seed = seed
        self.algorithm = algorithm if algorithm is not None else Algorithm()
        self.precision = self.config.precision or default_precision(self.config.accelerator)
        self.fabric = make_fabric(self.config, self.precision)
        self.collective = Collective(self.fabric)
        threads = use_threads(self.config.threads, max(1, self.fabric.world_size // self.config.num_nodes))
        self.data: FederatedData = load_clients(data, seed).to(self.device)
        self.attack = None
        if attack is not None and attack.active:  # data attacks change the attackers' rows once, here
            self.attack = Attack(attack, self.data.num_clients, self.data.num_classes, stream_seed(seed, "attack"))
            self.data = self.attack.poison(self.data)
        self.transform = transform = batch_transform(data.on_after_batch_transfer, self.fabric)
        self.module = model
        self.fabric.setup_module(model)
        model._fabric = None  # per-step self.log through Fabric would sync the device; training logs per round
        self.flat = flat = FlatModel(model)
        trainer = ClientTrainer(self.fabric, model, flat, transform, self.config.batch_size, self.config.local_epochs)
        check_evaluation_split(self.data.split(self.config.eval_split).sizes(), self.config.eval_split)
        self.aggregation = self._aggregation(privacy)
        # every process keeps the same rows in memory, so their spill files are laid out alike: the first one's budget
        budget = self.collective.broadcast(client_state_budget(self.config.client_state_memory, self.device))
        self.client_states = ClientStates(self.device, budget, self.collective.rank)
        self.server = ServerContext(self.data, model, flat, trainer, self.fabric, transform, seed,
                                    self.config.rounds, self.config.eval_split, self.config.eval_batch_size,
                                    self.client_states, self.aggregation)
        tamper = self.attack.tamper if self.attack is not None and self.attack.tampers() else None
        self.execution = ClientExecution(self.algorithm, self.server, trainer, self.config, self.collective,
                                         threads, self.aggregation.hold_reason(), tamper)
        self.evaluator = Evaluator(self.server, model, self.data, self.collective)
        self.newcomers: HeldOutClients | None = None  # clients held out of training (`unseen/*`)
        self.newcomer_evaluator: Evaluator | None = None
        if self.data.newcomers is not None:
            self.newcomers = HeldOutClients(self.data.newcomers, self.server, trainer, self.execution.training)
            self.newcomer_evaluator = Evaluator(self.server, model, self.data.newcomers, self.collective, UNSEEN)
        self.round = 0
        self.algorithm.setup(self.server)

    def _aggregation(self, privacy: PrivacyConfig | None) -> ClusterAggregation:
        """The cluster aggregator the configuration asks for, checked against the algorithm and the clients."""
        c, n = self.config, self.data.num_clients
        settings = RobustSettings(c.aggregator, c.aggregator_f, c.aggregator_beta, c.aggregator_clip, c.aggregator_keep)
        mechanism = None if privacy is None else PrivacyMechanism(
            privacy, c.rounds, clients_per_round(self.algorithm, n), n, stream_seed(self.seed, "privacy"))
        aggregation = ClusterAggregation(settings, mechanism)
        check_aggregation(aggregation, self.algorithm, self.data.num_clients)
        return aggregation

    def describe_threats(self) -> str:
        """The start line's note of the aggregator, the attack and privacy, when the run has any ('' otherwise)."""
        parts = [part for part in (self.aggregation.describe(), self.attack and self.attack.describe()) if part]
        return "; " + ", ".join(parts) if parts else ""

    @property
    def device(self) -> torch.device:
        return self.fabric.device

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def run_round(self, round: int) -> RoundResult:
        """Run round `round` (1-based) and return what it produced."""
        alg = self.algorithm
        self.aggregation.begin_round(round)
        alg.begin_round(round)
        clients = alg.select_clients(round)
        updates = self.execution.round_updates(round, clients)
        alg.pre_aggregation(round, updates)
        alg.aggregate(round, updates)
        alg.post_aggregation(round, updates)
        if round == 1:
            self.aggregation.check_applied(alg)
        training = updates.finish()
        self.client_states.write_returned(updates)
        self.round = round
        clusters = alg.cluster_labels()
        stop = self.end_aggregation(len(clients))
        logged, matrices = self.server.round_log.take()
        result = RoundResult(round, len(clients), training.left_out, training.metrics, {**logged, **alg.round_metrics()},
                             self.cluster_scores(clusters), matrices=matrices, stop_reason=stop)
        if round % self.config.eval_every == 0 or round == self.config.rounds:
            self.evaluate_round(result, training, clusters)
        return result

    def end_aggregation(self, selected: int) -> str | None:
        """Record what the round's aggregation measured (privacy spent, the adaptive clip); why the run must stop
        before the next round (a privacy budget reached), or None."""
        aggregated, stop = self.aggregation.end_round(selected, self.num_clients)
        for name, value in aggregated.items():
            self.server.round_log.scalar(name, value)
        return stop

    def cluster_scores(self, clusters: np.ndarray | None) -> dict[str, float]:
        """The clustering against the true clusters, and against them with the attackers as a cluster of their own."""
        scores = self.evaluator.score_clusters(clusters)
        if self.attack is not None and clusters is not None:
            scores["cluster/ari_attackers"] = self.attack.ari_with_attackers(self.data.cluster_labels, clusters)
        return scores

    def evaluate_round(self, result: RoundResult, training: TrainingReport, clusters: np.ndarray | None) -> None:
        """Fill `result` with the training clients' evaluation and the newcomers' (`unseen/*`)."""
        result.evaluation, result.per_client = self.evaluate_clients(result.round, training, clusters)
        if self.newcomers is not None:
            unseen, result.newcomers = self.evaluate_newcomers(result.round, clusters)
            result.evaluation.update(unseen)

    def evaluate(self, split: str | None = None) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(summaries across clients, per-client values) of every client's own model on `split` (default: the
        configured evaluation split)."""
        return self.evaluator.evaluate(self.algorithm.evaluation_models(), split)

    def evaluate_clients(self, round: int, training: TrainingReport, clusters: np.ndarray | None) -> tuple[dict, dict]:
        """(summaries, per-client columns): every client's evaluation (and, with `finetune_epochs`, its fine-tuned
        one), the mean of its primary metric within each true and each found cluster (`cluster_acc/true_<c>`,
        `cluster_acc/found_<c>`), its training values and its facts."""
        train, epochs = self.server.train, self.config.finetune_epochs
        models = self.algorithm.evaluation_models()
        summary, values = self.evaluated(self.evaluator, models,
                                         lambda client, start: train(round, client, start, epochs=epochs,
                                                                     purpose="finetune")[0])
        metric = "acc" if "acc" in values else next(iter(values))
        for kind, labels in (("true", self.data.cluster_labels), ("found", clusters)):
            if labels is not None:
                summary.update(per_cluster_means(values[metric], labels, f"cluster_{metric}/{kind}"))
        facts = self.evaluator.client_facts(clusters)
        if self.attack is not None:
            facts.update(self.attack.client_columns())
            if self.attack.config.kind == "backdoor":
                split = self.config.eval_split
                success, baseline = self.attack.backdoor_success(self.evaluator, models, split)
                summary[f"{split}/backdoor_success"], summary[f"{split}/backdoor_baseline"] = success, baseline
        return summary, {**values, **training.per_client, **facts}

    def evaluate_newcomers(self, round: int, clusters: np.ndarray | None) -> tuple[dict, dict]:
        """(`unseen/*` summaries, per-newcomer columns): the held-out clients evaluated with the models
        `Algorithm.newcomer_models` gives them at this round (fine-tuned too, with `finetune_epochs`), and where
        they were placed scored against their true clusters (`unseen/ari`)."""
        newcomers, evaluator, epochs = self.newcomers, self.newcomer_evaluator, self.config.finetune_epochs
        newcomers.round = round
        models, groups, placed = self.algorithm.newcomer_models(newcomers)
        summary, values = self.evaluated(evaluator, (models, groups), lambda j, start: newcomers.train(
            j, start, epochs, purpose="finetune"))
        placed = None if placed is None else torch.as_tensor(placed).cpu().numpy()
        summary.update(evaluator.score_newcomers(clusters, self.data.cluster_labels, placed))
        return summary, {**values, **evaluator.client_facts(placed)}

    def evaluated(self, evaluator: Evaluator, models_and_groups: tuple,
                  fine_tune: Callable[[int, torch.Tensor], torch.Tensor]) -> tuple[dict, dict]:
        """(summaries, per-client values) of the models, and with `finetune_epochs` of the models each client
        fine-tunes with `fine_tune(client, start)` (summaries `<name>_ft/`, values `ft_<metric>`)."""
        summary, values = evaluator.evaluate(models_and_groups)
        if self.config.finetune_epochs:
            tuned_summary, tuned_values = evaluator.evaluate(evaluator.fine_tuned(models_and_groups, fine_tune),
                                                             suffix="_ft")
            summary = {**summary, **tuned_summary}
            values = {**values, **{f"ft_{k}": v for k, v in tuned_values.items()}}
        return summary, values

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "algorithm": self.algorithm.state_dict(), "probe": self.execution.state_dict(),
                "aggregation": self.aggregation.state_dict(), "client_state": self.client_states.state_dict(),
                "attack": None if self.attack is None else self.attack.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = state["round"]
        self.algorithm.load_state_dict(move_data_to_device(state["algorithm"], self.device))
        self.client_states.load_state_dict(state.get("client_state"))
        self.execution.load_state_dict(state.get("probe"))
        self.aggregation.load_state_dict(state.get("aggregation"))
        if self.attack is not None:
            self.attack.load_state_dict(state.get("attack"))
