"""Run observers as callbacks, called by hook name as Lightning Fabric's callbacks are: the CSV recorder, the
console, W&B and checkpoints are callbacks, and a config's `callbacks:` list adds a user's own by class path.

A callback overrides any of `on_fit_start(run)`, `on_round_end(run, result)`, `on_fit_end(run, summary)`,
`on_interrupt(run)` (Ctrl-C, SIGTERM) and `on_exception(run, error)`; `run` is the `Run` (its federation, folder
and config), `result` the round's `RoundResult`.
Setting `run.should_stop` ends the run after the current round (`EarlyStopping`). A callback with state to keep
across a resume returns it from `state_dict()` (plain values and tensors) and takes it back in `load_state_dict`;
the checkpoint keeps it under the callback's class and the arguments it was built with (`callback_keys`), which
`Callback.__new__` records, so the order of the callbacks does not matter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console

from fedlight.run.callback_keys import construction_key, key_class, state_keys

if TYPE_CHECKING:
    from fedlight.engine.federation import Federation
    from fedlight.engine.round_result import RoundResult


class RunInterrupted(Exception):
    """Ctrl-C or SIGTERM (`terminated`) during a run: the rounds up to `saved_round` are in the run folder's
    checkpoint. `main_process`: raised in the process that reports for the run (the first of several)."""

    def __init__(self, run_dir: Path, saved_round: int, terminated: bool = False, main_process: bool = True) -> None:
        super().__init__(f"{'terminated' if terminated else 'interrupted'} after round {saved_round}")
        self.run_dir, self.saved_round = run_dir, saved_round
        self.terminated, self.main_process = terminated, main_process


@dataclass
class Run:
    """A run as its callbacks see it.

    Attributes:
        federation: the federation being run (its algorithm, config, round).
        run_dir: the run folder (written by the first process only).
        config: the resolved config.
        config_text: the resolved config as config.yaml holds it.
        name: the run's name.
        console: where the first process prints (the others get a silent one).
        main_process: whether this is the process that writes the run folder and logs.
        resumed: whether the run continues from a checkpoint.
        should_stop: set by a callback to end the run after this round; `stop_reason` says why.
    """

    federation: "Federation"
    run_dir: Path
    config: dict[str, Any]
    config_text: str
    name: str
    console: Console
    main_process: bool = True
    resumed: bool = False
    should_stop: bool = False
    stop_reason: str | None = None


class Callback:
    """Base of run callbacks: every hook does nothing."""

    _construction_key: str  # the key of its state in a checkpoint (`__new__`)

    def __new__(cls, *args: Any, **kwargs: Any) -> "Callback":
        """Record the class and the arguments the callback is built with (by a config or in Python): the key of
        its state in a checkpoint. Here rather than in `__init__`, which subclasses override without `super()`."""
        callback = super().__new__(cls)
        callback._construction_key = construction_key(cls, args, kwargs)
        return callback

    def on_fit_start(self, run: Run) -> None:
        """Before the first round to run (after a checkpoint was loaded when resuming)."""

    def on_round_end(self, run: Run, result: "RoundResult") -> None:
        """After every round."""

    def on_fit_end(self, run: Run, summary: dict[str, Any]) -> None:
        """After the last round, with the run's summary (what summary.json holds)."""

    def on_interrupt(self, run: Run) -> None:
        """After Ctrl-C or SIGTERM stopped the run (the last checkpoint is intact)."""

    def on_exception(self, run: Run, error: BaseException) -> None:
        """After an error stopped the run (the last checkpoint is intact)."""

    def state_dict(self) -> dict[str, Any]:
        """What the callback keeps in a checkpoint (`callback_states`); nothing here."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back what `state_dict` gave, on a resume (nothing to take here)."""
        pass


def call(callbacks: list[Any], hook: str, *args: Any) -> None:
    """Call `hook` on every callback that has it, in order (any object with such methods will do)."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if callable(method):
            method(*args)


def callback_states(callbacks: list[Any]) -> dict[str, Any]:
    """Every callback's state by its key (what a checkpoint keeps)."""
    return {
        key: c.state_dict()
        for key, c in zip(state_keys(callbacks), callbacks)
        if callable(getattr(c, "state_dict", None))
    }


def load_callback_states(callbacks: list[Any], states: dict[str, Any]) -> None:
    """Give every callback the state saved under its key, whatever the callbacks' order. A callback built with
    other arguments than the saved one (the logger's settings, which a resume may change) takes the state left over
    of its class when it is the only one of its class on both sides; with several, which is which cannot be told
    and the resume is refused. A callback added since has no state to take; the state of one removed is dropped."""
    keys = state_keys(callbacks)
    given = {key: states[key] for key in keys if key in states}
    left_saved = [key for key in states if key not in given]
    left_new = [key for key in keys if key not in given]
    for name in dict.fromkeys(key_class(key) for key in left_new):
        saved = [key for key in left_saved if key_class(key) == name and states[key]]  # an empty state: no swap
        new = [key for key in left_new if key_class(key) == name]
        if len(saved) == len(new) == 1:
            given[new[0]] = states[saved[0]]
        elif saved:
            raise ValueError(
                f"the checkpoint holds the state of {', '.join(saved)}, and this run has "
                f"{', '.join(new)} instead: which is which cannot be told; resume with the callbacks' "
                "arguments as they were saved, or start a new run"
            )
    for key, callback in zip(keys, callbacks):
        if key in given and callable(getattr(callback, "load_state_dict", None)):
            callback.load_state_dict(given[key])


class EarlyStopping(Callback):
    """Stop the run when a logged metric has not improved for `patience` evaluated rounds.

    Args:
        monitor: a column of metrics.csv, e.g. "val/acc_mean" (evaluate on validation data to select on it).
        mode: "max" (higher is better) or "min".
        patience: evaluated rounds without an improvement of more than `min_delta` before stopping.
        min_delta: the smallest change that counts as an improvement.
    """

    def __init__(
        self, monitor: str, mode: Literal["max", "min"] = "max", patience: int = 5, min_delta: float = 0.0
    ) -> None:
        if mode not in ("max", "min") or patience < 1 or min_delta < 0:
            raise ValueError(
                f"EarlyStopping needs mode 'max' or 'min', patience >= 1 and min_delta >= 0, got "
                f"{mode!r}, {patience}, {min_delta}"
            )
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, min_delta
        self.best = math.nan
        self.best_round = 0
        self.waited = 0

    def on_round_end(self, run: Run, result: "RoundResult") -> None:
        scalars = result.scalars
        if self.monitor not in scalars:
            if result.evaluated:  # every column exists in an evaluated round
                raise ValueError(
                    f"EarlyStopping monitors {self.monitor!r}, which the run does not log: choose one of "
                    f"{', '.join(k for k in scalars if '/' in k)}"
                )
            return
        value = float(scalars[self.monitor])
        sign = 1.0 if self.mode == "max" else -1.0
        if math.isnan(self.best) or sign * (value - self.best) > self.min_delta:
            self.best, self.best_round, self.waited = value, result.round, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            run.should_stop = True
            run.stop_reason = (
                f"{self.monitor} has not improved for {self.patience} evaluated rounds (best "
                f"{self.best:.4f} in round {self.best_round})"
            )

    def state_dict(self) -> dict[str, Any]:
        """The best value, its round and the evaluated rounds waited since, so a resumed run keeps counting."""
        return {"best": self.best, "best_round": self.best_round, "waited": self.waited}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the best value, its round and the rounds waited from `state_dict`."""
        self.best, self.best_round, self.waited = state["best"], state["best_round"], state["waited"]
