"""`RoundResult`: what one round produced, as one typed record handed to the run's callbacks (console, CSV, W&B,
checkpoints, a user's own)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RoundResult:
    """One round's numbers.

    Attributes:
        round: the round (1-based).
        clients_trained: clients selected this round (over every process).
        left_out: clients left out of aggregation (non-finite update, loss or returned state, and the `dropped`).
        training: `train/loss`, `train/<name>` of what training_step logged, `train/lr`.
        logged: what the algorithm recorded (`Algorithm.log`) and its `round_metrics()`.
        clustering: `cluster/count` and the scores against the true clusters, when the algorithm clusters.
        evaluation: `<split>/<metric>_mean`, `_std` and `_worst` across clients; empty when not evaluated.
        per_client: one array per column of clients.csv (metrics, training values, clusters, sizes); empty when not
            evaluated.
        matrices: client-by-client matrices by name (`Algorithm.log_matrix`).
        newcomers: one array per column of the held-out clients' rows in clients.csv (their metrics, the cluster
            they were placed in, their true cluster, their sizes); empty when not evaluated or none is held out.
        seconds: wall time of the round, set by the runner.
        stop_reason: why the run must stop after this round (a privacy budget reached), or None.
        dropped: the selected clients that sent nothing (offline, dropped out, past a deadline: a `system:`
            section), untrained, among `left_out`.
    """

    round: int
    clients_trained: int
    left_out: list[int]
    training: dict[str, float]
    logged: dict[str, float]
    clustering: dict[str, float]
    evaluation: dict[str, float] = field(default_factory=dict)
    per_client: dict[str, np.ndarray] = field(default_factory=dict)
    matrices: dict[str, np.ndarray] = field(default_factory=dict)
    newcomers: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: float = math.nan
    stop_reason: str | None = None
    dropped: list[int] = field(default_factory=list)

    @property
    def evaluated(self) -> bool:
        """Whether the round was evaluated (it has per-client values)."""
        return bool(self.per_client)

    @property
    def scalars(self) -> dict[str, float | int]:
        """The row of metrics.csv, in its column order."""
        row: dict[str, float | int] = {
            "round": self.round,
            "clients_trained": self.clients_trained,
            "clients_left_out": len(self.left_out),
        }
        row.update(self.training)
        row.update(self.logged)
        row.update(self.clustering)
        row.update(self.evaluation)
        if not math.isnan(self.seconds):
            row["time/round_s"] = self.seconds
        return row
