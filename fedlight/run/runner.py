"""Runs a `Federation` round by round and calls the run's callbacks by hook name: the CSV recorder, the console,
W&B, a user's own (`callbacks:` in the config) and, last, the round checkpoints. Ends with the summary."""

from __future__ import annotations

import contextlib
import math
import numbers
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console

from fedlight.engine.federation import Federation
from fedlight.engine.newcomer_evaluation import NewcomerEvaluation
from fedlight.engine.round_result import RoundResult
from fedlight.reports import selection
from fedlight.reports.intervals import client_bootstrap
from fedlight.run import checkpoint, failures, termination
from fedlight.run.callbacks import Callback, Run, RunInterrupted, call, callback_states, load_callback_states
from fedlight.run.console import ConsoleReporter, make_console
from fedlight.run.recorder import CsvRecorder
from fedlight.run.wandb_logger import LoggerConfig, WandbLogger

CHECKPOINTS = Path("checkpoints")
CLIENT_STATE = Path("client_state")  # the spill files of per-client state (`fedlight.plugin.client_state`)


class Totals(Callback):
    """What the summary needs of the rounds: wall time, the last evaluated scalars, and of every evaluated round
    what choosing a round needs (`fedlight.reports.selection`), kept in the checkpoint so that a resumed run
    chooses among all of them."""

    def __init__(self) -> None:
        self.elapsed = 0.0
        self.last_eval: dict[str, float | int] = {}
        self.evaluated: list[dict[str, float | int]] = []
        self.last_clients: list[float] = []  # the last evaluated round's primary metric, client by client

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        self.elapsed += result.seconds
        if result.evaluated:
            self.last_eval = scalars(result.scalars)
            split = run.federation.config.eval_split
            self.evaluated.append(selection.kept_keys(self.last_eval, split))
            metric = selection.primary_metric(selection.metric_names(self.last_eval, split))
            if metric in result.per_client:
                self.last_clients = [float(v) for v in result.per_client[metric]]

    def client_interval(self, split: str, sizes: np.ndarray) -> dict[str, float]:
        """The last round's primary metric's mean over clients with its 95 % bootstrap interval over clients
        (`<split>/<metric>_mean_low`, `_high`), and the resolution of the median client's value (1 / its samples on
        `split`: one sample moves its accuracy by that much)."""
        names = selection.metric_names(self.last_eval, split)
        if not self.last_clients or not names:
            return {}
        metric = selection.primary_metric(names)
        interval = client_bootstrap(self.last_clients)
        median = float(np.median(sizes[sizes > 0])) if (sizes > 0).any() else math.nan
        return {
            f"{split}/{metric}_mean_low": interval.low,
            f"{split}/{metric}_mean_high": interval.high,
            f"{split}/{metric}_resolution": 1.0 / median if median else math.nan,
        }

    def selections(self, split: str) -> dict[str, Any]:
        """The validation-selected and the `split`-selected numbers of the primary metric (the summary's)."""
        names = selection.metric_names(self.last_eval, split)
        return selection.selections(self.evaluated, split, selection.primary_metric(names)) if names else {}

    def state_dict(self) -> dict[str, Any]:
        """The wall time so far, the last evaluated scalars, what every evaluated round keeps for choosing a round, and
        the last evaluated round's per-client values of the primary metric."""
        return {
            "elapsed": self.elapsed,
            "last_eval": self.last_eval,
            "evaluated": self.evaluated,
            "last_clients": self.last_clients,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved (`last_clients` empty in a checkpoint written before it was kept)."""
        self.elapsed, self.last_eval, self.evaluated = state["elapsed"], state["last_eval"], state["evaluated"]
        self.last_clients = state.get("last_clients", [])


class Checkpointer(Callback):
    """Writes the round checkpoint every `every` rounds, after the last and when the run stops early: the
    federation's state and every callback's (the first process only); every process then marks the checkpoint
    taken, so no spilled client-state row it refers to is overwritten while a kept checkpoint may be read back."""

    def __init__(self, every: int, callbacks: list[Any]) -> None:
        self.every, self.callbacks = every, callbacks
        self.saved_round = 0

    def on_fit_start(self, run: Run) -> None:
        self.saved_round = run.federation.round

    def on_round_end(self, run: Run, result: RoundResult) -> None:
        if result.round % self.every and result.round != run.federation.config.rounds and not run.should_stop:
            return
        if run.main_process:
            state = {"federation": run.federation.state_dict(), "callbacks": callback_states(self.callbacks)}
            checkpoint.save(state, run.run_dir / CHECKPOINTS)
        run.federation.client_states.checkpointed()
        self.saved_round = result.round


def fit(
    federation: Federation,
    run_dir: Path,
    config_text: str,
    logger: LoggerConfig | None = None,
    run_name: str = "run",
    checkpoint_every: int = 1,
    resume: bool = False,
    console: Console | None = None,
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """Run the remaining rounds of `federation` and return the summary written to summary.json.

    `config_text` is the resolved config (YAML) the run folder keeps. With `resume`, the state of the last round
    checkpoint in `run_dir` is loaded first (the federation's and every callback's); the metrics files keep the rows
    up to that round, so the run ends exactly as an uninterrupted one would. Nothing is written before the run is
    accepted, and a new run stopped before its first checkpoint (Ctrl-C, SIGTERM, an error) leaves no folder; an
    error after it carries a note (`failure_note`) saying what is kept and how to go on. SIGTERM stops the run as
    Ctrl-C does (`fedlight.run.termination`: one process at once, several after the round in progress).
    `callbacks` are the user's own, called after the built-in observers and before the checkpoint."""
    collective = federation.collective
    main_process = collective.rank == 0  # only the first of several processes writes the run folder and prints
    console = (console or make_console()) if main_process else make_console(quiet=True)
    logger = logger or LoggerConfig()
    run = Run(federation, run_dir, yaml.safe_load(config_text), config_text, run_name, console, main_process)
    totals = Totals()
    observers: list[Any] = [totals, ConsoleReporter(console)]
    if main_process:
        observers = [CsvRecorder(), *observers, *([WandbLogger(logger)] if logger.wandb else [])]
    stateful = [*observers, *(callbacks or [])]
    checkpointer = Checkpointer(checkpoint_every, stateful)
    every = [*stateful, checkpointer]
    federation.client_states.use_folder(run_dir / CLIENT_STATE)  # read back on resume, so set before it
    federation.check_client_state_disk()  # the rows beyond the memory budget fit on that folder's disk?
    run.resumed = collective.broadcast(resume and checkpoint.exists(run_dir / CHECKPOINTS))  # a run stopped before
    if run.resumed:  # its first checkpoint
        state = collective.broadcast(checkpoint.load(run_dir / CHECKPOINTS) if main_process else None)  # restarts
        assert state is not None  # the first process's checkpoint, on every process
        state = checkpoint.upgrade(state, stateful)  # an older format's, in this process's callbacks' terms
        federation.load_state_dict(state["federation"])
        load_callback_states(stateful, state["callbacks"])
        if federation.round > federation.config.rounds:
            raise ValueError(
                f"{run_dir} has run {federation.round} rounds already: --federation.rounds must be at "
                f"least {federation.round}"
            )
    if main_process:
        run_dir.mkdir(parents=True, exist_ok=resume)
    rounds_together = termination.deferred() if collective.spread else contextlib.nullcontext()
    try:
        with termination.sigterm_as_interrupt(), rounds_together:
            call(every, "on_fit_start", run)
            for round in range(federation.round + 1, federation.config.rounds + 1):
                started = time.perf_counter()
                result = federation.run_round(round)
                result.seconds = time.perf_counter() - started
                if result.stop_reason:  # the engine's own reason to stop (a privacy budget), seen by every callback
                    run.should_stop, run.stop_reason = True, result.stop_reason
                terminated = collective.spread and termination.requested_anywhere(collective)
                run.should_stop |= terminated  # SIGTERM to any of several processes: all stop after this checkpoint
                call(every, "on_round_end", run, result)
                if terminated:
                    raise termination.Terminated()
                if run.should_stop:
                    break
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (`termination.Terminated`)
        call(every, "on_interrupt", run)
        if not resume and not checkpointer.saved_round:  # a new run with nothing saved: leave nothing behind
            if main_process:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        raise RunInterrupted(
            run_dir, checkpointer.saved_round, termination.terminated(interrupt), main_process
        ) from None
    except Exception as error:
        call(every, "on_exception", run, error)
        if main_process:
            if not resume and not checkpointer.saved_round:  # as after Ctrl-C: the name is free again
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                failures.add_note(error, failures.failure_note(error, run_dir, checkpointer.saved_round))
        else:
            failures.mark_follower(error)
        raise
    summary = _summary(run, totals)
    call(every, "on_fit_end", run, summary)
    collective.close()
    return summary


def scalars(metrics: dict[str, Any]) -> dict[str, float | int]:
    """The round's numbers as plain Python values (a checkpoint holds nothing else)."""
    # typeshed's numbers.Real declares no __int__ (numpy's and Python's reals have one)
    return {
        k: int(v) if k == "round" else float(v)  # type: ignore[call-overload]
        for k, v in metrics.items()
        if isinstance(v, numbers.Real) and not isinstance(v, bool)
    }


def _summary(run: Run, totals: Totals) -> dict[str, Any]:
    federation, plan = run.federation, run.federation.execution.plan
    newcomers = federation.extension(NewcomerEvaluation)
    final = {k: v for k, v in totals.last_eval.items() if k != "round" and not k.startswith("time/")}
    probe = federation.execution.probe_result
    return {
        "run": run.name,
        "algorithm": type(federation.algorithm).__name__,
        "rounds": federation.round,
        "num_clients": federation.num_clients,
        **({"held_out_clients": newcomers.count} if newcomers is not None else {}),
        "seed": federation.seed,
        "precision": federation.precision,
        "device": str(federation.device),
        "plan": plan.as_dict(),
        "vectorized": plan.trainer != "sequential",
        "vectorized_reason": plan.reason,
        "vectorize_probe": None if probe is None else probe.as_dict(),
        "federated_entries": federation.flat.numel,
        "frozen_base": federation.frozen_base,
        **({"stopped": run.stop_reason} if run.stop_reason else {}),
        **federation.extensions.summary(),
        "wall_time_s": round(totals.elapsed, 3),
        **final,
        **totals.selections(federation.config.eval_split),
        **totals.client_interval(
            federation.config.eval_split, federation.data.split(federation.config.eval_split).sizes()
        ),
    }
