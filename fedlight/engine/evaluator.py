"""Evaluating every client's own model on its split, spread over the processes, with what is recorded of each
client beside its metrics (its clusters and training-set size) and the clustering scores. One evaluator serves the
training clients, another the clients held out of training (`unseen/*`)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import lightning as L
import numpy as np
import torch

from fedlight.cluster.scores import clustering_scores
from fedlight.plugin.aggregation import ClientModels
from fedlight.plugin.data import FederatedData
from fedlight.plugin.evaluation import per_client_classification, summarize
from fedlight.engine.processes import Collective

if TYPE_CHECKING:
    from fedlight.plugin.server import ServerContext


class Evaluator:
    """Runs the algorithm's evaluation models over every client's evaluation split of `data` (the training clients,
    or the newcomers); summaries are named `<split>/...`, or `<name>/...` when a `name` is given."""

    def __init__(self, server: "ServerContext", module: L.LightningModule, data: FederatedData,
                 collective: Collective, name: str | None = None) -> None:
        self.server, self.module, self.data, self.collective, self.name = server, module, data, collective, name

    def evaluate(self, models_and_groups: tuple, split: str | None = None,
                 suffix: str = "") -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(summaries across clients, per-client values) of the models in `models_and_groups` (as
        `Algorithm.evaluation_models` gives them) on every client's split; summaries under `<split><suffix>/`.
        Spread over processes, each evaluates every `world`-th client and the per-client values are gathered."""
        split = split or self.server.eval_split
        num_clients, device = self.data.num_clients, self.server.device
        data = self.data.split(split)
        client_of_row = data.client_of_row()
        x, y = data.x, data.y
        collective = self.collective
        if collective.spread:
            mine = (client_of_row % collective.world == collective.rank).nonzero().flatten()
            x, y, client_of_row = x[mine], y[mine], client_of_row[mine]
        models, group_of_client = models_and_groups
        group_of_row = group_of_client[client_of_row]
        order = torch.argsort(group_of_row, stable=True)
        counts = torch.bincount(group_of_row, minlength=len(models)).tolist()
        outputs = None
        begin = 0
        for group, count in enumerate(counts):
            if count:
                rows = order[begin: begin + count]
                out = self.outputs(models[group], x[rows])  # a lazy model may train here (fine-tuning)
                if outputs is None:
                    outputs = out.new_empty((len(order), *out.shape[1:]))
                outputs[rows] = out
                begin += count
        if outputs is None:  # no row to evaluate on this process
            outputs = self.outputs(models[0], x[:0])
        metric_fn = getattr(self.module, "client_metrics", None)
        if metric_fn is not None:
            per_client = metric_fn(outputs, y, client_of_row, num_clients)
        else:
            per_client = per_client_classification(outputs, y, client_of_row, num_clients, self.data.num_classes)
        if collective.spread:  # each client's values from the process that evaluated it
            owner = torch.arange(num_clients, device=device) % collective.world
            per_client = {k: collective.stack(v)[owner, torch.arange(num_clients, device=device)]
                          for k, v in per_client.items()}
        values = {k: v.cpu().numpy() if v.is_floating_point() else v.cpu().double().numpy()
                  for k, v in per_client.items()}
        empty = data.sizes() == 0
        for v in values.values():
            v[empty] = np.nan  # a client with nothing to evaluate has no value, and is left out of the means
        return summarize(values, (self.name or split) + suffix), values

    def outputs(self, model: "torch.Tensor | Callable[[torch.Tensor], torch.Tensor]", x: torch.Tensor) -> torch.Tensor:
        """A model's outputs on raw inputs `x`: a flat model runs through the module (`ServerContext.predict`); a
        callable is a predictor of the algorithm's own that returns logits or log-probabilities (a mixture of
        component models, as FedEM predicts)."""
        return model(x) if callable(model) else self.server.predict(model, x)

    def evaluate_and_fine_tune(self, models_and_groups: tuple,
                               fine_tune: "Callable[[int, torch.Tensor], torch.Tensor] | None" = None
                               ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(summaries, per-client values) of the models, and with a `fine_tune(client, start)` (the run's
        `finetune_epochs`) of the models each client fine-tunes from its own (summaries `<name>_ft/`, values
        `ft_<metric>`)."""
        summary, values = self.evaluate(models_and_groups)
        if fine_tune is not None:
            tuned_summary, tuned_values = self.evaluate(self.fine_tuned(models_and_groups, fine_tune), suffix="_ft")
            summary = {**summary, **tuned_summary}
            values = {**values, **{f"ft_{k}": v for k, v in tuned_values.items()}}
        return summary, values

    def fine_tuned(self, models_and_groups: tuple, train: "Callable[[int, torch.Tensor], torch.Tensor]"
                   ) -> tuple[ClientModels, torch.Tensor]:
        """Every client's evaluation model (as `models_and_groups` gives them) fine-tuned by `train(client, start)`
        on its own training split, built one client at a time when evaluated."""
        models, group_of_client = models_and_groups
        n = self.data.num_clients
        return (ClientModels(lambda client: train(client, models[int(group_of_client[client])]), n),
                torch.arange(n, device=self.server.device))

    def client_facts(self, clusters: np.ndarray | None) -> dict[str, np.ndarray]:
        """What is recorded of each client beside its metrics: the cluster it was evaluated in (when the
        algorithm clusters), its true cluster (when the split defines one) and its training-set size."""
        facts = {} if clusters is None else {"cluster": np.asarray(clusters)}
        if self.data.cluster_labels is not None:
            facts["true_cluster"] = np.asarray(self.data.cluster_labels)
        facts["samples"] = np.asarray(self.data.train.sizes())
        return facts

    def score_newcomers(self, training: np.ndarray | None, training_truth: np.ndarray | None,
                        placed: np.ndarray | None) -> dict[str, float]:
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
            scores.update({f"cluster/{k}": v for k, v in clustering_scores(self.data.cluster_labels, predicted).items()})
        return scores
