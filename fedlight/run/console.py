"""What a run prints: one line per round, clustering events, left-out clients, and a summary table at the end.

On a terminal a progress bar sits under the round lines; when the output goes to a file or a pipe there is no
bar and no wrapping, just one plain line per round, so logs stay greppable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fedlight.plugin.evaluation import UNSEEN
from fedlight.reports import selection
from fedlight.run.callbacks import Callback, Run

if TYPE_CHECKING:
    from fedlight.engine.round_result import RoundResult


def make_console(quiet: bool = False) -> Console:
    """A console that does not wrap or decorate lines when it is not writing to a terminal (`quiet`: prints
    nothing, for the other processes of a run spread over several)."""
    console = Console(quiet=quiet)
    if console.is_terminal:
        return console
    return Console(soft_wrap=True, highlight=False, width=200, color_system=None, quiet=quiet)


class ConsoleReporter(Callback):
    """Prints the rounds of one run as they finish (the callback behind the console): a start line with the plan,
    one line per round preceded by its events, and the summary table at the end."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.clusters = 1.0  # every run starts from one model: announce the first split, not the start
        self.progress: Progress | None = None

    def on_fit_start(self, run: Run) -> None:
        federation = run.federation
        if run.resumed:
            self.console.print(f"Resuming {run.run_dir} after round {federation.round}", highlight=False)
        from fedlight.engine.newcomer_evaluation import NewcomerEvaluation  # loaded with the federation already

        newcomers = federation.extension(NewcomerEvaluation)
        held = f" + {newcomers.count} held out" if newcomers is not None else ""
        self.console.print(
            f"{type(federation.algorithm).__name__}, {federation.cohort.describe()}{held}: "
            f"{federation.execution.plan.describe()}{federation.describe_threats()}"
            f"{federation.describe_frozen_base()}",
            highlight=False,
        )
        if self.console.is_terminal:
            self.progress = Progress(
                TextColumn("[bold]round"),
                MofNCompleteColumn(),
                BarColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.task = self.progress.add_task("rounds", total=federation.config.rounds, completed=federation.round)
            self.progress.start()

    def on_round_end(self, run: Run, result: "RoundResult") -> None:
        """The round's line, preceded by its events (clients left out, a change in the number of clusters)."""
        round, metrics = result.round, result.scalars
        dropped = set(result.dropped)  # they sent nothing (the system model's system/* columns count them)
        left_out = [c for c in result.left_out if c not in dropped]
        if left_out:
            shown = ", ".join(str(c) for c in left_out[:10]) + (", ..." if len(left_out) > 10 else "")
            self.console.print(
                f"round {round}: {len(left_out)} client(s) left out of aggregation, non-finite update "
                f"or loss (clients {shown})"
            )
        clusters = metrics.get("cluster/count")
        if clusters is not None and clusters != self.clusters:
            self.console.print(f"round {round}: {cluster_text(metrics)}")
            self.clusters = clusters
        self.console.print(f"round {round:>4}  {round_text(metrics, run.federation.config.eval_split)}")
        if self.progress is not None:
            self.progress.update(self.task, completed=round)

    def on_fit_end(self, run: Run, summary: dict[str, Any]) -> None:
        self._stop()
        if run.stop_reason:
            self.console.print(f"stopped after round {run.federation.round}: {run.stop_reason}", highlight=False)
        self.console.print(summary_table(summary, run.federation.config.eval_split, plain=not self.console.is_terminal))
        self.console.print(f"run folder: {run.run_dir}", highlight=False)

    def on_interrupt(self, run: Run) -> None:
        self._stop()

    def on_exception(self, run: Run, error: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def cluster_text(metrics: dict[str, Any]) -> str:
    """'4 clusters, ARI 1.00' (the ARI when the data defines true clusters)."""
    count = _number(metrics["cluster/count"], "cluster/count")
    text = f"{count} cluster{'' if count == '1' else 's'}"
    if "cluster/ari" in metrics:
        text += f", ARI {metrics['cluster/ari']:.2f}"
    return text


FINE_TUNED = "_ft"  # `<split>_ft/`: the summaries of the models each client fine-tuned (federation.finetune_epochs)
PRIVACY = "privacy/epsilon"  # the privacy spent so far, with client-level DP


def round_text(metrics: dict[str, Any], split: str) -> str:
    """'acc 0.9120 ± 0.0510 (worst 0.8000)  f1 ...  4 clusters, ARI 1.00' for an evaluated round; the training
    loss otherwise."""
    names = selection.metric_names(metrics, split)
    parts = [
        f"{name} {metrics[f'{split}/{name}_mean']:.4f} ± {metrics[f'{split}/{name}_std']:.4f} "
        f"(worst {metrics[f'{split}/{name}_worst']:.4f})"
        for name in names
    ]
    if not parts:
        parts = [f"train loss {metrics['train/loss']:.4f}"]
    else:
        for prefix, label in ((f"{split}{FINE_TUNED}", "fine-tuned"), (UNSEEN, UNSEEN)):  # their primary metric
            if f"{prefix}/{names[0]}_mean" in metrics:
                parts.append(
                    f"{label} {names[0]} {metrics[f'{prefix}/{names[0]}_mean']:.4f} "
                    f"(worst {metrics[f'{prefix}/{names[0]}_worst']:.4f})"
                )
    if PRIVACY in metrics:
        parts.append(f"epsilon {metrics[PRIVACY]:.2f}")
    if "cluster/count" in metrics:
        parts.append(cluster_text(metrics))
    return "  ".join(parts)


HELD = "held_out_clients"  # summary.json: clients held out of training, when some are


def summary_table(summary: dict[str, Any], split: str, plain: bool = False) -> Table:
    """The final numbers; `plain` draws it with ASCII characters (for logs)."""
    rounds, clients = (_number(summary[key], "count") for key in ("rounds", "num_clients"))
    title = (
        f"{summary['run']}: {summary['algorithm']}, {rounds} round{'' if rounds == '1' else 's'}, "
        f"{clients} client{'' if clients == '1' else 's'}"
        f"{f' + {summary[HELD]} held out' if summary.get(HELD) else ''}, {summary['wall_time_s']:.1f} s"
    )
    table = Table(box=box.ASCII2 if plain else box.HEAVY_HEAD, title=title)
    for column in ("metric", "mean", "std", "worst client"):
        table.add_column(column, justify="right" if column != "metric" else "left")
    metric, chosen = selected_rows(summary, split)
    for prefix, label in (
        (split, split),
        (f"{split}{FINE_TUNED}", f"{split} fine-tuned"),
        (UNSEEN, f"{UNSEEN} ({split})"),
    ):  # fine-tuned, then held-out clients, after the rest
        for name in selection.metric_names(summary, prefix):
            last = prefix == split and name == metric  # beside it, the rounds chosen on validation and on split
            table.add_row(
                f"{label} {name}{', last round' if last else ''}",
                *(_number(summary[f"{prefix}/{name}_{s}"]) for s in ("mean", "std", "worst")),
            )
            if last and f"{prefix}/{name}_mean_low" in summary:  # the clients' bootstrap, and one sample's weight
                low, high = summary[f"{prefix}/{name}_mean_low"], summary[f"{prefix}/{name}_mean_high"]
                table.add_row(f"{label} {name}, 95 % interval over clients", f"{_number(low)}-{_number(high)}", "", "")
                table.add_row(
                    f"{label} {name}, one sample of the median client",
                    _number(summary[f"{prefix}/{name}_resolution"]),
                    "",
                    "",
                )
            for row in chosen if last else ():
                table.add_row(*row)
    for key, value in summary.items():
        if key.startswith("cluster/") or key in (f"{UNSEEN}/ari", PRIVACY):
            table.add_row(key, _number(value, key), "", "")
    return table


def selected_rows(summary: dict[str, Any], split: str) -> tuple[str | None, list[tuple[str, str, str, str]]]:
    """The metric the summary's chosen rounds concern (`fedlight.reports.selection`) and the summary table's rows of
    them: the validation-selected round's mean and worst client (or why there is none), then the best round on
    `split` itself; (None, []) when the summary chose no round."""
    own = selection.selected_prefix(split)
    names = selection.metric_names(summary, f"{own}/{split}")
    if not names:
        return None, []
    metric, rows = names[0], []
    for name in dict.fromkeys((selection.VAL_SELECTED, own)):  # one with split val
        label = f"{split} {metric}, {name.replace('_', '-')}"
        if f"{name}/round" in summary:
            rows.append(
                (
                    f"{label} (round {summary[f'{name}/round']})",
                    _number(summary[f"{name}/{split}/{metric}_mean"]),
                    "",
                    _number(summary.get(f"{name}/{split}/{metric}_worst")),
                )
            )
        else:
            rows.append((label, str(summary.get(selection.NO_VAL_SELECTION, "n/a")), "", ""))
    return metric, rows


def _number(value: Any, name: str = "") -> str:
    """A value for the console: 4 decimals, None as n/a, and a whole-valued count (a metric `name` whose last
    part holds count, round or size, or starts with clients_: `cluster/count`, `clients_left_out`) as an integer
    (metrics.csv keeps the float)."""
    if value is None:
        return "n/a"
    last = name.rsplit("/", 1)[-1]
    if (
        isinstance(value, float)
        and value.is_integer()
        and (any(part in last for part in ("count", "round", "size")) or last.startswith("clients_"))
    ):
        return str(int(value))
    return f"{value:.4f}" if isinstance(value, float) else str(value)
