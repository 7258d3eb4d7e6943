"""Runs a `Federation` round by round with console output, logging, round checkpoints and a final summary."""
from __future__ import annotations

import numbers
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from fedlight import checkpoint
from fedlight.console import RoundReporter, make_console, summary_table
from fedlight.evaluation import higher_is_better
from fedlight.federation import Federation
from fedlight.recorder import LoggerConfig, RunRecorder, SilentRecorder

CHECKPOINTS = Path("checkpoints")


class RunInterrupted(Exception):
    """Ctrl-C during a run: the rounds up to `saved_round` are in the run folder's checkpoint."""

    def __init__(self, run_dir: Path, saved_round: int) -> None:
        super().__init__(f"interrupted after round {saved_round}")
        self.run_dir, self.saved_round = run_dir, saved_round


def fit(federation: Federation, run_dir: Path, config: dict[str, Any], logger: LoggerConfig | None = None,
        run_name: str = "run", checkpoint_every: int = 1, resume: bool = False,
        console: Console | None = None) -> dict[str, Any]:
    """Run the remaining rounds of `federation` and return the summary written to summary.json.

    With `resume`, the state of the last round checkpoint in `run_dir` is loaded first; the metrics files
    keep the rows up to that round, so the run ends exactly as an uninterrupted one would."""
    collective = federation.collective
    main_process = collective.rank == 0  # only the first of several processes writes the run folder and prints
    console = (console or make_console()) if main_process else make_console(quiet=True)
    logger = logger or LoggerConfig()
    state: dict[str, Any] = {"elapsed": 0.0, "wandb_id": None, "last_eval": {}, "best": {}}
    resume = collective.broadcast(resume and checkpoint.exists(run_dir / CHECKPOINTS))  # a run stopped before its
    if resume:                                                                          # first checkpoint restarts
        state = collective.broadcast(checkpoint.load(run_dir / CHECKPOINTS) if main_process else None)
        federation.load_state_dict(state["federation"])
        if federation.round > federation.config.rounds:
            raise ValueError(f"{run_dir} has run {federation.round} rounds already: --federation.rounds must be at "
                             f"least {federation.round}")
        console.print(f"Resuming {run_dir} after round {federation.round}")
    recorder = RunRecorder(run_dir, config, logger, run_name, state["wandb_id"], federation.round,
                           algorithm=type(federation.algorithm).__name__) if main_process else SilentRecorder()
    rounds, split = federation.config.rounds, federation.config.eval_split
    saved = federation.round
    try:
        with RoundReporter(console, rounds, federation.round, split) as reporter:
            for round in range(federation.round + 1, rounds + 1):
                started = time.perf_counter()
                metrics = federation.run_round(round)
                metrics["time/round_s"] = time.perf_counter() - started
                state["elapsed"] += metrics["time/round_s"]
                recorder.log_round(metrics)
                if "clients" in metrics:
                    state["last_eval"] = scalars(metrics)
                    _track_best(state["best"], state["last_eval"], split)
                reporter.round(metrics)
                if round % checkpoint_every == 0 or round == rounds:
                    if main_process:
                        checkpoint.save({**state, "federation": federation.state_dict(),
                                         "wandb_id": recorder.wandb_id}, run_dir / CHECKPOINTS)
                    saved = round
    except KeyboardInterrupt:
        recorder.close(interrupted=True)
        raise RunInterrupted(run_dir, saved) from None
    summary = _summary(federation, state, run_name)
    recorder.finish(summary)
    console.print(summary_table(summary, split, plain=not console.is_terminal))
    console.print(f"run folder: {run_dir}", highlight=False)
    if recorder.offline_dir is not None:
        console.print(f"upload to W&B: wandb sync {recorder.offline_dir}", highlight=False)
    return summary


def scalars(metrics: dict[str, Any]) -> dict[str, float | int]:
    """The round's numbers as plain Python values (a checkpoint holds nothing else)."""
    return {k: int(v) if k == "round" else float(v) for k, v in metrics.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool)}


def _track_best(best: dict[str, Any], metrics: dict[str, Any], split: str) -> None:
    """Remember the round with the best mean of the primary (first) per-client metric."""
    means = [k for k in metrics if k.startswith(f"{split}/") and k.endswith("_mean")]
    if not means:
        return
    mean = means[0]
    better = higher_is_better(mean[len(split) + 1: -len("_mean")])
    if mean not in best or (metrics[mean] > best[mean] if better else metrics[mean] < best[mean]):
        best.clear()
        best.update({mean: metrics[mean], "round": metrics["round"]})


def _summary(federation: Federation, state: dict[str, Any], run_name: str) -> dict[str, Any]:
    final = {k: v for k, v in state["last_eval"].items() if k != "round" and not k.startswith("time/")}
    return {"run": run_name, "algorithm": type(federation.algorithm).__name__, "rounds": federation.round,
            "num_clients": federation.num_clients, "seed": federation.seed, "precision": federation.precision,
            "device": str(federation.device), "vectorized": federation.vectorized is not None,
            "vectorized_reason": federation.vectorized_reason,
            "vectorize_probe": None if federation.probe_result is None else federation.probe_result.as_dict(),
            "wall_time_s": round(state["elapsed"], 3), **final,
            **{f"best/{k}": v for k, v in state["best"].items()}}
