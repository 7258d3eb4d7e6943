"""The federated loop: each round is the algorithm's story, select -> train -> pre_aggregation -> aggregate ->
post_aggregation -> evaluate (docs/architecture.md, "The round as data flow"). How clients train and where
(groups, trainers, processes) is `fedlight.engine.execution`'s; evaluation is `fedlight.engine.evaluator`'s; the
per-client state the algorithm declares is `fedlight.plugin.client_state`'s, written after `post_aggregation`.

Every random choice is a pure function of (seed, round, client, purpose), so a run resumed from a round
checkpoint repeats exactly what the uninterrupted run does, and the order clients are trained in does not
matter.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from fedlight.plugin.algorithm import Algorithm
from fedlight.aggregators.attacks import Attack, AttackConfig
from fedlight.engine.client_states import ClientStates
from fedlight.plugin.client_work import message_bytes
from fedlight.plugin.cohort import Cohort
from fedlight.aggregators.cluster_aggregator import ClusterAggregation, check_aggregation
from fedlight.aggregators.config import AggregatorConfig, attackers_beyond_rule
from fedlight.engine.config import FederationConfig
from fedlight.plugin.data import ClientDataModule, FederatedData, check_evaluation_split, load_clients
from fedlight.engine.devices import (
    available_memory,
    batch_transform,
    client_state_budget,
    default_precision,
    make_fabric,
)
from fedlight.engine.divergence import watched_round
from fedlight.plugin.evaluation import UNSEEN, per_cluster_means
from fedlight.plugin.extension import ExtensionContext
from fedlight.plugin.model_parts import ModelParts, head_name
from fedlight.engine.evaluator import Evaluator
from fedlight.engine.execution import ClientExecution
from fedlight.engine.extensions import Extension, RoundExtension, RoundExtensions
from fedlight.engine.held_out import HeldOutClients
from fedlight.engine.newcomer_evaluation import NewcomerEvaluation
from fedlight.aggregators.privacy import PrivacyConfig, PrivacyMechanism
from fedlight.aggregators.server_optimizer import ServerOptimizer, ServerOptimizerConfig
from fedlight.engine.processes import Collective
from fedlight.engine.round_result import RoundResult
from fedlight.engine.round_limits import check_held_round_fits
from fedlight.engine.state_limits import check_round_fits, disk_shortfall
from fedlight.plugin.round_updates import RoundUpdates, TrainingReport
from fedlight.plugin.server import ServerContext, stream_seed
from fedlight.engine.threads import use_threads
from fedlight.system.config import SystemConfig
from fedlight.system.system_model import SystemModel
from fedlight.training.flat import FlatModel, frozen_fingerprint
from fedlight.training.sequential import ClientTrainer
from fedlight.training.trainer_stand_in import TrainerStandIn


class Federation:
    """One federated run in memory: data on the device, one module, an algorithm, and the round loop.

    What a run adds around the round (the constructor's threat and DP settings, clients held out of training, the
    clients' devices, and `extensions` of one's own) are round extensions (`fedlight.engine.extensions`), called at
    fixed points of the set-up and of every round; `aggregator` (the `aggregator:` section) picks the rule that
    combines each cluster's updates (`fedlight.aggregators.cluster_aggregator`). None of them changes anything when
    left at its default."""

    def __init__(
        self,
        data: ClientDataModule,
        model: L.LightningModule,
        algorithm: Algorithm | None = None,
        config: FederationConfig | None = None,
        seed: int = 0,
        attack: AttackConfig | None = None,
        privacy: PrivacyConfig | None = None,
        extensions: list[RoundExtension] | None = None,
        system: SystemConfig | None = None,
        aggregator: AggregatorConfig | None = None,
        server_optimizer: ServerOptimizerConfig | None = None,
    ) -> None:
        self.config = config or FederationConfig()
        self.aggregator = aggregator or AggregatorConfig()
        self.seed = seed
        self.algorithm = algorithm if algorithm is not None else Algorithm()
        self.precision = self.config.precision or default_precision(self.config.accelerator)
        self.fabric = make_fabric(self.config, self.precision)
        self.collective = Collective(self.fabric)
        threads = use_threads(self.config.threads, max(1, self.fabric.world_size // self.config.num_nodes))
        self.data: FederatedData = load_clients(data, seed).to(self.device)
        self.cohort = Cohort(
            self.data.num_clients, getattr(self.algorithm, "participation", 1.0), self.config.clients_per_round
        )
        self.extensions = self._extensions(attack, privacy, extensions or [], system, server_optimizer)
        self.data = self.extensions.prepare_data(self.data)
        self.transform = transform = batch_transform(data.on_after_batch_transfer, self.fabric)
        self.module = model
        head = head_name(model)  # before a method adds modules of its own, which must not be taken for the head
        self.algorithm.extend_model(ModelParts(model, head, self.data.num_classes))
        self.fabric.setup_module(model)
        model._fabric = None  # per-step self.log through Fabric would sync the device; training logs per round
        # (the module's `self.trainer` is then the stand-in the client trainer attaches)
        self.flat = flat = FlatModel(model)
        self.frozen_base = frozen_fingerprint(model)  # the pretrained base outside the flat vector: a resume checks it
        trainer = ClientTrainer(
            self.fabric,
            model,
            flat,
            transform,
            self.config.batch_size,
            self.config.local_epochs,
            self._trainer_stand_in(),
        )
        trainer.learning_rates.check(self.config.rounds, trainer.stand_in.estimated_stepping_batches)
        check_evaluation_split(self.data.split(self.config.eval_split).sizes(), self.config.eval_split)
        # what an evaluated round also measures so that the run's round can be chosen on validation data (the
        # summary's `val_selected/`): the val split, when the clients have one and it is not the evaluated split
        self.also_evaluated = ("val",) if self.config.eval_split != "val" and self.data.val.sizes().sum() else ()
        self.aggregation = self._aggregation()
        # every process keeps the same rows in memory, so their spill files are laid out alike: the first one's budget
        budget = self.collective.broadcast(client_state_budget(self.config.client_state_memory, self.device))
        self.client_states = ClientStates(self.device, budget, self.collective.rank)
        self.server = ServerContext(
            self.data,
            model,
            flat,
            trainer,
            self.fabric,
            transform,
            seed,
            self.config.rounds,
            self.config.eval_split,
            self.config.eval_rows(self.device.type),
            self.client_states,
            self.aggregation,
            self.config.clients_per_round,
            self.config.eval_every,
            head,
        )
        self.execution = ClientExecution(
            self.algorithm,
            self.server,
            trainer,
            self.config,
            self.collective,
            threads,
            self.aggregation.hold_reason(),
            self.extensions.tamper,
            self.extensions.work,
            self.extensions.arrivals,
        )
        self.server.cohort.bind(self.extensions.select)
        self.evaluator = Evaluator(self.server, model, self.data, self.collective)
        self.round = 0
        self.sampling = self.extensions.sampling()  # how a round's clients are chosen, for DP's accounting
        self.extensions.setup(self.extension_context())
        self.algorithm.setup(self.server)
        self.extensions.check_message(self.server.message, type(self.algorithm).__name__)
        check_round_fits(self.client_states, self.cohort.size)  # the stores are declared: a round's rows fit?
        if self.execution.holds:
            check_held_round_fits(
                type(self.algorithm).__name__,
                self.cohort.size,
                flat.numel,
                flat.vector.element_size(),
                available_memory(self.device),
            )
        self._disk_checked = False  # the spilled rows' disk: checked once their folder is chosen, or in round 1
        self.execution.plan.every_client = list(self.server.cohort.every_client_work)

    def extension_context(self) -> ExtensionContext:
        """What the round extensions may use of the run (`fedlight.plugin.extension.ExtensionContext`)."""

        def held_out(data: FederatedData) -> tuple[HeldOutClients, Evaluator]:
            training = self.execution
            return (
                HeldOutClients(data, self.server, training.trainer, training.training),
                Evaluator(self.server, self.module, data, self.collective, UNSEEN),
            )

        return ExtensionContext(
            self.server,
            self.algorithm,
            self.config,
            self.cohort.size,
            self.collective.world,
            self.sampling,
            self.flat.vector.detach(),
            self.evaluator,
            self.data.cluster_labels,
            held_out,
        )

    def _extensions(
        self,
        attack: AttackConfig | None,
        privacy: PrivacyConfig | None,
        own: list[RoundExtension],
        system: SystemConfig | None = None,
        server_optimizer: ServerOptimizerConfig | None = None,
    ) -> RoundExtensions:
        """The run's round extensions, built once from the constructor's arguments and the data, in the order their
        hooks run: client-level DP (`privacy`), the attackers (`attack`), the clients held out of training (the
        data's newcomers), the clients' devices (`system`), the server optimizer, then `own`. The only place this
        module names them."""
        n, seed = self.data.num_clients, self.seed
        built: list[RoundExtension] = []
        if privacy is not None:
            built.append(
                PrivacyMechanism(privacy, self.config.rounds, self.cohort.size, n, stream_seed(seed, "privacy"))
            )
        if attack is not None and attack.active:
            built.append(Attack(attack, n, self.data.num_classes, stream_seed(seed, "attack")))
            beyond = attackers_beyond_rule(self.aggregator, attack.fraction, self.cohort.size)
            if beyond:
                warnings.warn(beyond, stacklevel=3)
        if self.data.newcomers is not None:
            built.append(NewcomerEvaluation(self.data.newcomers))
        if system is not None:
            built.append(SystemModel(system, n, seed))
        if server_optimizer is not None:
            built.append(ServerOptimizer(server_optimizer))
        return RoundExtensions(built + own)

    def _trainer_stand_in(self) -> TrainerStandIn:
        """What the module reads as `self.trainer` (`fedlight.training.trainer_stand_in`): the local epochs, the
        batches of an epoch of the largest client (every client trains on the same schedule) and the processes."""
        return TrainerStandIn.of_run(
            self.fabric,
            self.config.num_nodes,
            self.config.local_epochs,
            self.config.batch_size,
            self.data.largest_training_split(),
        )

    def _aggregation(self) -> ClusterAggregation:
        """The cluster aggregator the configuration and the extensions ask for, checked against the algorithm and
        the clients."""
        aggregation = self.extensions.aggregation(ClusterAggregation(self.aggregator))
        check_aggregation(aggregation, self.algorithm, self.cohort.size)
        return aggregation

    def describe_threats(self) -> str:
        """The start line's note of the aggregator and the extensions, when the run has any ('' otherwise)."""
        parts = [part for part in (self.aggregation.describe(), *self.extensions.describe()) if part]
        return "; " + ", ".join(parts) if parts else ""

    def describe_frozen_base(self) -> str:
        """The start line's note of a frozen pretrained base ('' without one): what travels against what stays."""
        base = self.frozen_base
        if not base["tensors"]:
            return ""
        size = self.flat.vector.element_size()
        return (
            f"; {self.flat.numel:,} entries federated ({self.flat.numel * size / 1e3:,.1f} kB), a frozen base of "
            f"{base['entries']:,} held once"
        )

    def extension(self, kind: type[Extension]) -> Extension | None:
        """The run's round extension of class `kind` (`fedlight.engine.extensions`), or None."""
        return self.extensions.find(kind)

    @property
    def device(self) -> torch.device:
        """This process's device (Fabric's): where the server state is kept and its clients train."""
        return self.fabric.device

    @property
    def num_clients(self) -> int:
        """How many training clients the data has."""
        return self.data.num_clients

    def run_round(self, round: int) -> RoundResult:
        """Run round `round` (1-based) and return what it produced (`RoundDiverged`: it left nothing to go on)."""
        alg = self.algorithm
        self.begin_round(round)
        clients = alg.select_clients(round)
        self.cohort.check_selected(type(alg).__name__, round, len(clients), self.server.cohort.drawn(round))
        self.check_client_state(round, len(clients))
        updates = self.execution.round_updates(round, clients)
        with watched_round(round, updates, alg, self.extensions.suspects(), self.aggregation.default):
            alg.pre_aggregation(round, updates)
            alg.aggregate(round, updates)
            alg.post_aggregation(round, updates)
            if round == 1:
                self.aggregation.check_applied(alg, self.flat.numel)
            training = updates.finish()
        self.store_returned(updates)
        self.round, clusters = round, alg.cluster_labels()
        result = self.round_result(round, len(clients), training, clusters, self.end_round(round, clients))
        if self.server.run.evaluates(round):
            self.evaluate_round(result, training, clusters)
        return result

    def round_result(
        self, round: int, cohort: int, training: TrainingReport, clusters: np.ndarray | None, stop: str | None
    ) -> RoundResult:
        """What round `round` produced before evaluation: its training report, what the algorithm and the server
        logged, its clustering scores and why the run stops after it (None: it goes on)."""
        logged, matrices = self.server.log.take()
        return RoundResult(
            round,
            cohort,
            training.left_out,
            training.metrics,
            {**logged, **self.algorithm.round_metrics()},
            self.cluster_scores(clusters),
            matrices=matrices,
            stop_reason=stop,
            dropped=training.dropped,
        )

    def store_returned(self, updates: RoundUpdates) -> None:
        """Write what the round's clients returned under a store's name into the client states, then let the round's
        updates go (an evaluated round would otherwise hold a round of models while it evaluates)."""
        self.client_states.write_returned(updates)
        updates.release()

    def check_client_state(self, round: int, selected: int) -> None:
        """Refuse in one line a round whose clients' rows exceed the client-state memory budget
        (`fedlight.engine.state_limits`), and, the first time, a run whose spilled rows cannot fit on the disk."""
        check_round_fits(self.client_states, selected, round)
        if not self._disk_checked:
            self.check_client_state_disk()

    def check_client_state_disk(self) -> None:
        """Refuse in one line a run whose rows beyond the memory budget cannot fit on the disk of their folder (the
        runner's, once chosen; else the temporary folder's). The first process measures and every process gets its
        answer, so all of them stop, or none."""
        shortfall = (
            disk_shortfall(
                self.client_states, self.num_clients, self.cohort.size, self.config.rounds, self.collective.world
            )
            if self.collective.rank == 0
            else None
        )
        shortfall = self.collective.broadcast(shortfall)
        self._disk_checked = True
        if shortfall:
            raise ValueError(shortfall)

    def travelling_bytes(self) -> float:
        """Bytes of the model entries that travel between a client and the server: the flat vector (the frozen base is
        outside it) less the entries each client keeps for itself (`personal_mask`)."""
        mask = self.algorithm.personal_mask
        entries = self.flat.numel - (int(mask.sum()) if mask is not None else 0)
        return float(entries * self.flat.vector.element_size())

    def begin_round(self, round: int) -> None:
        """Tell the aggregation, the round extensions and the algorithm that round `round` begins; forget the work
        counted since the last round (its evaluation's)."""
        self.server.clients.work.take()
        self.aggregation.begin_round(round)
        self.extensions.begin_round(round)
        self.algorithm.begin_round(round)

    def end_round(self, round: int, clients: list[int]) -> str | None:
        """Log the bytes the round's clients received and sent (`comm/*`) and what the extensions measured once the
        round aggregated (a budget spent, a clip adapted); why the run must stop before the next round, or None."""
        work = self.server.clients.work
        work.share(self.collective)  # what the clients ran, for the virtual clock
        done = work.take()
        work.add(done)  # read, not taken: a round extension may charge it
        for name, value in message_bytes(done, clients, self.travelling_bytes()).items():
            self.server.log.scalar(name, value)
        scalars, stop = self.extensions.end_round(round, len(clients))
        for name, value in scalars.items():
            self.server.log.scalar(name, value)
        return stop

    def cluster_scores(self, clusters: np.ndarray | None) -> dict[str, float]:
        """The clustering against the true clusters, and the extensions' scores of it."""
        return {**self.evaluator.score_clusters(clusters), **self.extensions.cluster_scores(clusters)}

    def evaluate_round(self, result: RoundResult, training: TrainingReport, clusters: np.ndarray | None) -> None:
        """Fill `result` with the training clients' evaluation, their training values, facts and the extensions'
        columns, then what the extensions evaluate."""
        models = self.algorithm.evaluation_models()
        summary, values = self.evaluate_clients(result.round, models, clusters)
        facts = {**self.evaluator.client_facts(clusters), **self.extensions.client_columns()}
        result.evaluation, result.per_client = summary, {**values, **training.per_client, **facts}
        self.extensions.evaluate(result, models, clusters)

    def evaluate(self, split: str | None = None) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(summaries across clients, per-client values) of every client's own model on `split` (default: the
        configured evaluation split)."""
        return self.evaluator.evaluate(self.algorithm.evaluation_models(), split)

    def evaluate_clients(self, round: int, models: tuple, clusters: np.ndarray | None) -> tuple[dict, dict]:
        """(summaries, per-client values) of the evaluation `models` (and, with `finetune_epochs`, of each client's
        fine-tuned one; the summaries of the splits in `also_evaluated` beside them), with the mean of the primary
        metric within each true and each found cluster (`cluster_acc/true_<c>`, `cluster_acc/found_<c>`)."""
        train, epochs = self.server.clients.train, self.config.finetune_epochs
        fine_tune = (
            (lambda client, start: train(round, client, start, epochs=epochs, purpose="finetune").params)
            if epochs
            else None
        )
        summary, values = self.evaluator.evaluate_and_fine_tune(models, fine_tune, self.also_evaluated)
        metric = "acc" if "acc" in values else next(iter(values))
        for kind, labels in (("true", self.data.cluster_labels), ("found", clusters)):
            if labels is not None:
                summary.update(per_cluster_means(values[metric], labels, f"cluster_{metric}/{kind}"))
        return summary, values

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The round, the frozen base's fingerprint (never its tensors), the algorithm's state, the probe's choice, the
        client states (their rows in memory, their spilled rows' slots) and each extension's state under its name."""
        return {
            "round": self.round,
            "frozen_base": self.frozen_base,
            "algorithm": self.algorithm.state_dict(),
            "probe": self.execution.state_dict(),
            "client_state": self.client_states.state_dict(),
            **self.extensions.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved, refusing a checkpoint trained over another frozen base than the model loaded
        now."""
        saved = state.get("frozen_base")
        if saved is not None and saved != self.frozen_base:
            raise ValueError(
                f"the checkpoint was trained over another frozen base ({saved['tensors']} tensors, sha256 "
                f"{str(saved['sha256'])[:12]}) than the model loaded now ({self.frozen_base['tensors']} "
                f"tensors, sha256 {str(self.frozen_base['sha256'])[:12]}): resume with the pretrained "
                "model folder the run started from"
            )
        self.round = state["round"]
        self.algorithm.load_state_dict(move_data_to_device(state["algorithm"], self.device))
        self.client_states.load_state_dict(state.get("client_state"))
        self.execution.load_state_dict(state.get("probe"))
        self.extensions.load_state_dict(state)
