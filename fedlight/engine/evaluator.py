"""Evaluating every client's own model on its split, spread over the processes, with what is recorded of each
client beside its metrics (its clusters and training-set size) and the clustering scores. One evaluator serves the
training clients, another the clients held out of training (`unseen/*`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import lightning as L
import numpy as np
import torch

from fedlight.cluster.scores import clustering_scores
from fedlight.plugin.aggregation import ClientModels
from fedlight.plugin.data import ClientSplit, FederatedData
from fedlight.plugin.shared_body import SharedBodyModels, client_spans
from fedlight.plugin.evaluation import per_client_classification, summarize
from fedlight.engine.processes import Collective

if TYPE_CHECKING:
    from fedlight.plugin.server import ServerContext


class Evaluator:
    """Runs the algorithm's evaluation models over every client's evaluation split of `data` (the training clients,
    or the newcomers); summaries are named `<split>/...`, or `<name>/...` when a `name` is given."""

    def __init__(
        self,
        server: "ServerContext",
        module: L.LightningModule,
        data: FederatedData,
        collective: Collective,
        name: str | None = None,
    ) -> None:
        self.server, self.module, self.data, self.collective, self.name = server, module, data, collective, name

    def evaluate(
        self, models_and_groups: tuple, split: str | None = None, suffix: str = "", also: Sequence[str] = ()
    ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(summaries across clients, per-client values) of the models in `models_and_groups` (as
        `Algorithm.evaluation_models` gives them) on every client's split; summaries under `<split><suffix>/`.
        The splits in `also` (the validation split a run selects its round on) are measured in the same pass: each
        group's model runs once on its clients' rows of every split (a model built on demand is built once), and
        they add their summaries alone (`<also><suffix>/`). Spread over processes, each evaluates every `world`-th
        client and the per-client values are gathered."""
        splits = [split or self.server.run.eval_split, *also]
        data = [self.data.split(name) for name in splits]
        parts = [self.rows(one) for one in data]
        outputs = self.outputs_by_group(models_and_groups, parts)
        values = [
            self.client_values(out, y, client_of_row, one.sizes())
            for one, (_, y, client_of_row), out in zip(data, parts, outputs)
        ]
        summary = {
            key: value
            for name, these in zip(splits, values)
            for key, value in summarize(these, (self.name or name) + suffix).items()
        }
        return summary, values[0]

    def rows(self, data: ClientSplit) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x, y, the client of each row) of a split: every row, or with several processes those of this process's
        clients (every `world`-th)."""
        client_of_row, x, y = data.client_of_row(), data.x, data.y
        collective = self.collective
        if collective.spread:
            mine = (client_of_row % collective.world == collective.rank).nonzero().flatten()
            x, y, client_of_row = x[mine], y[mine], client_of_row[mine]
        return x, y, client_of_row

    def outputs_by_group(
        self, models_and_groups: tuple, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> list[torch.Tensor]:
        """The outputs on each split's rows (`parts`: (x, y, client of each row) a split, as `rows` gives them),
        a group at a time: its model is taken once (a model built on demand is built once) and runs one batched
        pass on its clients' rows of each split."""
        models, group_of_client = models_and_groups
        if isinstance(models, SharedBodyModels):
            shared = self.outputs_by_shared_body(models, parts)
            if shared is not None:
                return shared
        orders, counts = [], []
        for _, _, client_of_row in parts:
            group_of_row = group_of_client[client_of_row]
            orders.append(torch.argsort(group_of_row, stable=True))
            counts.append(torch.bincount(group_of_row, minlength=len(models)).tolist())
        outputs: list[torch.Tensor | None] = [None] * len(parts)
        begins = [0] * len(parts)
        for group in range(len(models)):
            if not any(count[group] for count in counts):
                continue
            model = models[group]  # a lazy model may train here (fine-tuning)
            for i, ((x, _, _), order, count) in enumerate(zip(parts, orders, counts)):
                if count[group]:
                    rows = order[begins[i] : begins[i] + count[group]]
                    out = self.outputs(model, x[rows])
                    written = outputs[i]
                    if written is None:
                        written = outputs[i] = out.new_empty((len(x), *out.shape[1:]))
                    written[rows] = out
                    begins[i] += count[group]
        return [
            self.outputs(models[0], x[:0]) if out is None else out  # no row to evaluate on this process
            for out, (x, _, _) in zip(outputs, parts)
        ]

    def outputs_by_shared_body(
        self, models: SharedBodyModels, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> list[torch.Tensor] | None:
        """`outputs_by_group` for clients that differ from their cluster's model only in the head: each cluster's
        body runs once over its clients' rows of every split, then each client's head (its cluster's head with its
        personal entries written in) on its rows' features. None when the network's outputs are not its head's
        (something follows the head, which the cluster's own head on the same features shows, or the head reads no
        feature row a sample): then every client runs its whole model."""
        view = self.server.model
        outputs: list[torch.Tensor | None] = [None] * len(parts)
        for cluster in range(len(models.bodies)):
            body = models.bodies[cluster]
            rows = [(models.group[client_of_row] == cluster).nonzero().flatten() for _, _, client_of_row in parts]
            features: dict[int, torch.Tensor] = {}
            for i, ((x, _, _), mine) in enumerate(zip(parts, rows)):
                if len(mine):
                    try:
                        features[i], out = view.features(body, x[mine])
                    except ValueError:  # a head applied to every position, pooled after it (GPT-2): no feature rows
                        return None
                    if not torch.allclose(view.head_outputs(body, features[i]), out, rtol=1e-4, atol=1e-5):
                        return None
                    if outputs[i] is None:
                        outputs[i] = out.new_empty((len(x), *out.shape[1:]))
            spans = {i: client_spans(parts[i][2][rows[i]]) for i in features}
            head = body.clone()  # the cluster's model, its personal entries rewritten for one client at a time
            for client in sorted({c for these in spans.values() for c in these}):
                head[models.personal_index] = models.personal_row(client)
                for i, these in spans.items():
                    if client in these:
                        at = these[client]  # positions among the cluster's rows of split i
                        outputs[i][rows[i][at]] = view.head_outputs(head, features[i][at])  # type: ignore[index]
        return [
            view.outputs(models.bodies[0], x[:0]) if out is None else out  # no row to evaluate on this process
            for out, (x, _, _) in zip(outputs, parts)
        ]

    def client_values(
        self, outputs: torch.Tensor, y: torch.Tensor, client_of_row: torch.Tensor, sizes: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Each client's metrics from the outputs on its rows (the module's `client_metrics`, else accuracy, F1 and
        loss), gathered from the process that evaluated it; NaN for a client with no row (`sizes` 0), which is
        left out of the means."""
        num_clients, device, collective = self.data.num_clients, self.server.device, self.collective
        metric_fn = getattr(self.module, "client_metrics", None)
        if metric_fn is not None:
            per_client = metric_fn(outputs, y, client_of_row, num_clients)
        else:
            per_client = per_client_classification(outputs, y, client_of_row, num_clients, self.data.num_classes)
        if collective.spread:  # each client's values from the process that evaluated it
            owner = torch.arange(num_clients, device=device) % collective.world
            per_client = {
                k: collective.stack(v)[owner, torch.arange(num_clients, device=device)] for k, v in per_client.items()
            }
        values = {
            k: v.cpu().numpy() if v.is_floating_point() else v.cpu().double().numpy() for k, v in per_client.items()
        }
        for v in values.values():
            v[sizes == 0] = np.nan
        return values

    def outputs(self, model: "torch.Tensor | Callable[[torch.Tensor], torch.Tensor]", x: torch.Tensor) -> torch.Tensor:
        """A model's outputs on raw inputs `x`: a flat model runs through the module (`ServerContext.model.outputs`); a
        callable is a predictor of the algorithm's own that returns logits or log-probabilities (a mixture of
        component models, as FedEM predicts)."""
        return model(x) if callable(model) else self.server.model.outputs(model, x)

    def evaluate_and_fine_tune(
        self,
        models_and_groups: tuple,
        fine_tune: "Callable[[int, torch.Tensor], torch.Tensor] | None" = None,
        also: Sequence[str] = (),
    ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(summaries, per-client values) of the models (with the summaries of the splits in `also`, see
        `evaluate`), and with a `fine_tune(client, start)` (the run's `finetune_epochs`) of the models each client
        fine-tunes from its own, on the evaluated split alone (summaries `<name>_ft/`, values `ft_<metric>`)."""
        summary, values = self.evaluate(models_and_groups, also=also)
        if fine_tune is not None:
            tuned_summary, tuned_values = self.evaluate(self.fine_tuned(models_and_groups, fine_tune), suffix="_ft")
            summary = {**summary, **tuned_summary}
            values = {**values, **{f"ft_{k}": v for k, v in tuned_values.items()}}
        return summary, values

    def fine_tuned(
        self, models_and_groups: tuple, train: "Callable[[int, torch.Tensor], torch.Tensor]"
    ) -> tuple[ClientModels, torch.Tensor]:
        """Every client's evaluation model (as `models_and_groups` gives them) fine-tuned by `train(client, start)`
        on its own training split, built one client at a time when evaluated."""
        models, group_of_client = models_and_groups
        n = self.data.num_clients
        return (
            ClientModels(lambda client: train(client, models[int(group_of_client[client])]), n),
            torch.arange(n, device=self.server.device),
        )

    def client_facts(self, clusters: np.ndarray | None) -> dict[str, np.ndarray]:
        """What is recorded of each client beside its metrics: the cluster it was evaluated in (when the
        algorithm clusters), its true cluster (when the split defines one) and its training-set size."""
        facts = {} if clusters is None else {"cluster": np.asarray(clusters)}
        if self.data.cluster_labels is not None:
            facts["true_cluster"] = np.asarray(self.data.cluster_labels)
        facts["samples"] = np.asarray(self.data.train.sizes())
        return facts

    def score_newcomers(
        self, training: np.ndarray | None, training_truth: np.ndarray | None, placed: np.ndarray | None
    ) -> dict[str, float]:
        """`unseen/ari`: the clustering of every client, the training clients' clusters (`training`) and the cluster
        each newcomer was placed in (`placed`, in the same labels), against the true clusters. It is 1 only when
        the training clients' clusters are the true ones and every newcomer joined its own; when the algorithm
        gives no training clusters, the newcomers' placement alone is scored."""
        truth = self.data.cluster_labels
        if placed is None or truth is None:
            return {}
        if training is not None and training_truth is not None:
            truth, placed = np.concatenate([training_truth, truth]), np.concatenate([training, placed])
        return {f"{self.name}/ari": clustering_scores(truth, placed)["ari"]}

    def score_clusters(self, predicted: np.ndarray | None) -> dict[str, float]:
        """A client clustering against the split's true clusters (when both exist)."""
        if predicted is None:
            return {}
        scores = {"cluster/count": float(len(np.unique(predicted)))}
        if self.data.cluster_labels is not None:
            scores.update(
                {f"cluster/{k}": v for k, v in clustering_scores(self.data.cluster_labels, predicted).items()}
            )
        return scores
