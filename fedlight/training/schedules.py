"""The module's optimizer and learning-rate schedulers from `configure_optimizers`, on the federation's clock.

Lightning's `configure_optimizers` may return an optimizer, a list of them, `([optimizers], [schedulers])`, or a
dict `{"optimizer": ..., "lr_scheduler": scheduler or {"scheduler": ..., "interval": "epoch"|"step",
"frequency": n}}`. fedlight trains one optimizer per client, so a federated round plays the part of an epoch:

- an `interval: "epoch"` scheduler steps once per round: the server's schedule, the same for every client;
- an `interval: "step"` scheduler steps after every local optimizer step of a client, starting afresh each round
  from the round's learning rate.

The learning rates are found by running the module's own scheduler objects on its optimizer (any scheduler that
needs no monitored metric works, chained or not), once per round for as many local steps as the round's longest
client takes, and the trainers set them step by step. So a client's learning rates depend only on (round, local
step), a resumed run has the same ones, and a round costs the same whatever its number. A scheduler with a fixed
length (OneCycleLR's `total_steps`) is built for one round's local steps, since step schedulers start afresh each
round: `total_steps=self.trainer.estimated_stepping_batches` is exactly that (`fedlight.training.trainer_stand_in`).
Asked for more, the error names the scheduler, the round and the steps needed; `LearningRates.check` asks for a whole
run's at set-up, so a schedule too short for the run's rounds or a round's steps stops it before any training.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

Rates = list[list[float]]  # rates[step][group]


@dataclass
class Scheduler:
    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1


def parse_optimizers(configured: Any) -> tuple[torch.optim.Optimizer, list[Scheduler]]:
    """(the optimizer, its schedulers) out of whatever `configure_optimizers` returned."""
    if isinstance(configured, torch.optim.Optimizer):
        return configured, []
    if isinstance(configured, dict) and "optimizer" in configured:
        optimizer = configured["optimizer"]
        entry = configured.get("lr_scheduler")
        return optimizer, [] if entry is None else [_scheduler(entry)]
    if (
        isinstance(configured, (list, tuple))
        and len(configured) == 2
        and isinstance(configured[0], (list, tuple))
        and isinstance(configured[1], (list, tuple))
    ):
        optimizer = parse_optimizers(configured[0][0])[0]
        schedulers = [_scheduler(entry) for entry in configured[1]]
        return optimizer, [s for s in schedulers if s.scheduler.optimizer is optimizer]
    if isinstance(configured, (list, tuple)) and configured:
        return parse_optimizers(configured[0])
    raise TypeError(
        "configure_optimizers() must return an optimizer, a list of them, ([optimizers], [schedulers]) "
        f"or a dict with 'optimizer' (and 'lr_scheduler'); got {type(configured).__name__}"
    )


def _scheduler(entry: Any) -> Scheduler:
    if isinstance(entry, dict):
        scheduler = Scheduler(entry["scheduler"], entry.get("interval", "epoch"), int(entry.get("frequency", 1)))
    else:
        scheduler = Scheduler(entry)
    if scheduler.interval not in ("epoch", "step"):
        raise ValueError(f"lr_scheduler interval must be 'epoch' or 'step', got {scheduler.interval!r}")
    if isinstance(scheduler.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError(
            "ReduceLROnPlateau steps on a monitored metric, which a federated round does not have: use "
            "a scheduler that steps by epoch (= round) or by step"
        )
    return scheduler


class LearningRates:
    """The learning rate of every local step of a round, per parameter group, without the algorithm's scale."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedulers: list[Scheduler]) -> None:
        self.optimizer, self.schedulers = optimizer, schedulers
        self.initial = [group["lr"] for group in optimizer.param_groups]  # what the schedulers start from
        self.states = [s.scheduler.state_dict() for s in schedulers]
        self.by_step = any(s.interval == "step" for s in schedulers)
        self._round = 0
        self._rates: Rates = []

    def rates(self, round: int, steps: int) -> Rates:
        """The rates of local steps 0..steps-1 of round `round` (1-based). A round is simulated once for the most
        steps asked of it (again only when a later call asks for more)."""
        if not self.schedulers:
            return [self.initial] * steps
        if round != self._round or len(self._rates) < steps:
            known = len(self._rates) if round == self._round else 0
            self._round, self._rates = round, self._simulate(round, max(steps, known))
        return self._rates[:steps]

    def check(self, rounds: int, steps: int) -> None:
        """Before any training: the error `rates` would raise in the round a fixed-length scheduler runs out (a step
        scheduler shorter than `steps` local steps fails in round 1, an epoch scheduler shorter than `rounds` - 1
        rounds in the last round), so a run that cannot finish its schedule does not start."""
        self.rates(1, steps)
        self.rates(rounds, 1)

    def round_rate(self, round: int, steps: int = 1) -> float:
        """The mean rate of the first parameter group over the first `steps` local steps of round `round`: the
        round's rate for an epoch schedule, what a client of `steps` steps trained at for a step schedule."""
        rates = [r[0] for r in self.rates(round, steps)]
        return rates[0] if all(r == rates[0] for r in rates) else sum(rates) / len(rates)

    def _simulate(self, round: int, steps: int) -> Rates:
        """Run the schedulers without training: restore their initial state, step the epoch ones once per finished
        round, then record the rates step by step while the step ones advance."""
        groups = self.optimizer.param_groups
        saved = [group["lr"] for group in groups]
        with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": there is no training here
            warnings.simplefilter("ignore")
            for group, lr in zip(groups, self.initial):
                group["lr"] = lr
            for s, state in zip(self.schedulers, self.states):
                s.scheduler.load_state_dict(state)
            for epoch in range(1, round):
                for s in self.schedulers:
                    if s.interval == "epoch" and epoch % s.frequency == 0:
                        _step(s, epoch, round - 1)
            rates = []
            for step in range(1, steps + 1):
                rates.append([group["lr"] for group in groups])
                for s in self.schedulers:
                    if s.interval == "step" and step % s.frequency == 0 and step < steps:
                        _step(s, round, steps)
        for group, lr in zip(groups, saved):
            group["lr"] = lr
        return rates


def _step(s: Scheduler, round: int, steps: int) -> None:
    """Step one scheduler; a scheduler that cannot step that often is named with the fix."""
    try:
        s.scheduler.step()
    except ValueError as error:
        example = f"e.g. OneCycleLR(total_steps={steps})"
        if s.interval == "step":
            fix = f"build it for {steps} local steps of a round, {example} (step schedulers start afresh each round)"
        else:  # Lightning's own OneCycleLR example leaves the interval at 'epoch', which is a round here
            fix = (
                f"build it for {steps} rounds, {example}, or give it 'interval': 'step' to step after every local step"
            )
        raise ValueError(
            f"{type(s.scheduler).__name__} (interval {s.interval!r}) cannot step again in round {round}: {error}; {fix}"
        ) from None
