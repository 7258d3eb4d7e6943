"""The clients held out of training, evaluated at every evaluated round (`unseen/*`): a round extension
(`fedlight.engine.extensions`) that asks the algorithm for their models (`Algorithm.newcomer_models`), evaluates
them as the training clients are evaluated (fine-tuned too, with `federation.finetune_epochs`) and scores where they
were placed (`unseen/ari`). The federation calls its hooks and never names it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from fedlight.plugin.data import FederatedData
from fedlight.engine.evaluator import Evaluator
from fedlight.plugin.extension import ExtensionContext, RoundExtension
from fedlight.engine.held_out import HeldOutClients

if TYPE_CHECKING:
    from fedlight.plugin.algorithm import Algorithm


class NewcomerEvaluation(RoundExtension):
    """`unseen/*` summaries and the held-out clients' rows of clients.csv. `clients` is the `Newcomers` the
    algorithm is handed (set up with the federation); nothing of theirs is checkpointed: their local work is
    seeded by (seed, round, newcomer, purpose), so an evaluation repeats exactly in a resumed run."""

    name = "newcomers"

    def __init__(self, data: FederatedData) -> None:
        self.data = data
        self.clients: HeldOutClients | None = None
        self.evaluator: Evaluator | None = None
        self.algorithm: "Algorithm | None" = None
        self.training_truth: np.ndarray | None = None
        self.finetune_epochs = 0

    @property
    def count(self) -> int:
        """How many clients are held out (known once set up)."""
        assert self.clients is not None, "setup runs first"
        return self.clients.count

    def setup(self, context: ExtensionContext) -> None:
        self.clients, self.evaluator = context.held_out(self.data)
        self.algorithm, self.training_truth = context.algorithm, context.true_clusters
        self.finetune_epochs = context.config.finetune_epochs

    def evaluate(
        self, round: int, models: tuple, clusters: np.ndarray | None
    ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """(`unseen/*` summaries, per-newcomer columns): the held-out clients evaluated with the models the
        algorithm gives them at this round, and where they were placed scored with the training clients'
        `clusters` against the true clusters (`unseen/ari`)."""
        clients, evaluator, algorithm, epochs = self.clients, self.evaluator, self.algorithm, self.finetune_epochs
        assert clients is not None and evaluator is not None and algorithm is not None, "setup runs first"
        clients.round = round
        given, groups, placed = algorithm.newcomer_models(clients)
        fine_tune = (lambda j, start: clients.train(j, start, epochs, purpose="finetune")) if epochs else None
        summary, values = evaluator.evaluate_and_fine_tune((given, groups), fine_tune)
        where = None if placed is None else torch.as_tensor(placed).cpu().numpy()
        summary.update(evaluator.score_newcomers(clusters, self.training_truth, where))
        return summary, {**values, **evaluator.client_facts(where)}
