"""Runs a `Federation` round by round with progress, logging, round checkpoints and a final summary."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fedlight import checkpoint
from fedlight.evaluation import higher_is_better
from fedlight.federation import Federation
from fedlight.recorder import LoggerConfig, RunRecorder

CHECKPOINT = Path("checkpoints") / "last.ckpt"


def fit(federation: Federation, run_dir: Path, config: dict[str, Any], logger: LoggerConfig | None = None,
        run_name: str = "run", checkpoint_every: int = 1, resume: bool = False,
        console: Console | None = None) -> dict[str, Any]:
    """Run the remaining rounds of `federation` and return the summary written to summary.json.

    With `resume`, the state of the last round checkpoint in `run_dir` is loaded first; the metrics files
    keep the rows up to that round, so the run ends exactly as an uninterrupted one would."""
    console = console or Console()
    logger = logger or LoggerConfig()
    run_dir.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {"elapsed": 0.0, "wandb_id": None, "last_eval": {}, "best": {}}
    if resume:
        state = checkpoint.load(run_dir / CHECKPOINT)
        federation.load_state_dict(state["federation"])
        console.print(f"Resuming {run_dir} after round {federation.round}")
    recorder = RunRecorder(run_dir, config, logger, run_name, state["wandb_id"],
                           federation.round if resume else None)
    rounds, split = federation.config.rounds, federation.config.eval_split
    with _progress(console) as progress:
        task = progress.add_task("rounds", total=rounds, completed=federation.round, status="")
        for round in range(federation.round + 1, rounds + 1):
            started = time.perf_counter()
            metrics = federation.run_round(round)
            metrics["time/round_s"] = time.perf_counter() - started
            state["elapsed"] += metrics["time/round_s"]
            recorder.log_round(metrics)
            if "clients" in metrics:
                names = [name for name in metrics["clients"] if f"{split}/{name}_mean" in metrics]
                state["last_eval"] = {k: v for k, v in metrics.items() if k not in ("clients", "matrices")}
                _track_best(state["best"], state["last_eval"], f"{split}/{names[0]}")
                status = _status(state["last_eval"], split, names)
                progress.update(task, status=status)
                progress.console.print(f"round {round:>4}  {status}")
            progress.update(task, completed=round)
            if round % checkpoint_every == 0 or round == rounds:
                checkpoint.save_atomic({**state, "federation": federation.state_dict(),
                                        "wandb_id": recorder.wandb_id}, run_dir / CHECKPOINT)
    summary = _summary(federation, state, run_name)
    recorder.finish(summary)
    console.print(_summary_table(summary, split))
    return summary


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("[bold]round"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), TextColumn("{task.fields[status]}"), console=console, transient=False)


def _status(metrics: dict[str, Any], split: str, names: list[str]) -> str:
    """'acc 0.9120 ± 0.0510 (worst 0.8000)  f1 ...' for every per-client metric."""
    return "  ".join(f"{name} {metrics[f'{split}/{name}_mean']:.4f} ± {metrics[f'{split}/{name}_std']:.4f} "
                     f"(worst {metrics[f'{split}/{name}_worst']:.4f})" for name in names)


def _track_best(best: dict[str, Any], metrics: dict[str, Any], key: str) -> None:
    """Remember the round with the best mean of the primary (first) metric."""
    mean = f"{key}_mean"
    better = higher_is_better(key.rsplit("/", 1)[-1])
    if mean not in best or (metrics[mean] > best[mean] if better else metrics[mean] < best[mean]):
        best.clear()
        best.update({mean: metrics[mean], "round": metrics["round"]})


def _summary(federation: Federation, state: dict[str, Any], run_name: str) -> dict[str, Any]:
    final = {k: v for k, v in state["last_eval"].items() if k != "round" and not k.startswith("time/")}
    return {"run": run_name, "algorithm": type(federation.algorithm).__name__, "rounds": federation.round,
            "num_clients": federation.num_clients, "seed": federation.seed, "precision": federation.precision,
            "device": str(federation.device), "wall_time_s": round(state["elapsed"], 3), **final,
            **{f"best/{k}": v for k, v in state["best"].items()}}


def _summary_table(summary: dict[str, Any], split: str) -> Table:
    table = Table(title=f"{summary['run']}: {summary['algorithm']}, {summary['rounds']} rounds, "
                        f"{summary['num_clients']} clients, {summary['wall_time_s']:.1f} s")
    for column in ("metric", "mean", "std", "worst client"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    names = [k[len(split) + 1: -len("_mean")] for k in summary if k.startswith(f"{split}/") and k.endswith("_mean")]
    for name in names:
        table.add_row(f"{split} {name}", *(f"{summary[f'{split}/{name}_{s}']:.4f}" for s in ("mean", "std", "worst")))
    extra = {k: v for k, v in summary.items() if k.startswith("cluster/")}
    for key, value in extra.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value), "", "")
    return table
