"""`TrialReporter`: the run callback through which a tuning trial talks to Optuna. After every evaluated round it
reports the objective metric (a validation metric) to the trial, so that the study's pruner can stop a hopeless
trial early, and it keeps the values the objective is averaged from. The engine knows nothing of it: it is an
ordinary `Callback`, and its state rides in the run's checkpoint, so a trial resumed after Ctrl-C reports the
rounds it had already run again and averages over the same values as an uninterrupted trial."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fedlight.run.callbacks import Callback, Run

if TYPE_CHECKING:
    from fedlight.engine.round_result import RoundResult


class TrialReporter(Callback):
    """Reports `metric` of every evaluated round to an Optuna `trial` and stops the run when the pruner says so
    or when the metric is not finite (the trial then fails; more rounds would not make it finite).

    Args:
        trial: the Optuna trial (anything with `report(value, step)` and `should_prune()`).
        metric: a column of metrics.csv on the validation split, e.g. "val/acc_mean".
        last_rounds: the objective is the mean of the metric over this many last evaluated rounds.
    """

    def __init__(self, trial: Any, metric: str, last_rounds: int = 3) -> None:
        self.trial, self.metric, self.last_rounds = trial, metric, last_rounds
        self.values: list[tuple[int, float]] = []  # (round, value) of every evaluated round
        self.pruned_round: int | None = None

    def on_fit_start(self, run: Run) -> None:
        for round, value in self.values:  # a resumed trial: the rounds run before the interruption
            if math.isfinite(value):
                self.trial.report(value, round)

    def on_round_end(self, run: Run, result: "RoundResult") -> None:
        if not result.evaluated:
            return
        if self.metric not in result.scalars:
            logged = ", ".join(k for k in result.scalars if k.startswith("val"))
            raise ValueError(f"--metric {self.metric}: the run does not log it; choose one of {logged}")
        value = float(result.scalars[self.metric])
        self.values.append((result.round, value))
        if not math.isfinite(value):
            run.should_stop, run.stop_reason = True, f"{self.metric} is {value} in round {result.round}"
            return
        self.trial.report(value, result.round)
        if self.trial.should_prune():
            self.pruned_round = result.round
            run.should_stop = True
            run.stop_reason = f"pruned by the study's pruner in round {result.round} ({self.metric} {value:.4f})"

    def objective(self) -> float:
        """The mean of the metric over the last `last_rounds` evaluated rounds (NaN when one is not finite)."""
        last = [value for _, value in self.values[-self.last_rounds :]]
        return sum(last) / len(last) if last else math.nan

    def state_dict(self) -> dict[str, Any]:
        """The (round, value) of every evaluated round so far and the round the trial was pruned in (or None)."""
        return {"values": [list(pair) for pair in self.values], "pruned_round": self.pruned_round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the values and pruned round of `state_dict`; `on_fit_start` reports the values to the trial again."""
        self.values = [(int(r), float(v)) for r, v in state["values"]]
        self.pruned_round = state["pruned_round"]
