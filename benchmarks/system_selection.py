"""The table of configs/sweeps/system_selection*.yaml: per method and selector (`system.selection`, with its
`system.candidates` d), the mean and standard deviation over seeds of the last round's mean test accuracy, its mean
over the last rounds (the label skew makes a single round's accuracy swing), the worst client's and the worst tenth
of the clients' accuracy, the ARI of the found clusters (clustered methods), the rounds and the virtual time to each
target mean accuracy (with how many seeds reached it), the mean virtual round and how many clients ever trained,
read from the run folders' metrics.csv and clients.csv alone (docs/system_experiments.md).

    python -m fedlight sweep --config configs/sweeps/system_selection.yaml
    python benchmarks/system_selection.py runs/sweep-system-selection [--targets 0.6 0.7] [--last 5] \
        [--figure selection.png]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedlight.reports import plots
from fedlight.reports.runs import VIRTUAL_TIME, Run, find_runs, group_runs, load_run
from system_stragglers import cell, last, selection_of, time_to_target


def selector_of(run: Run) -> str:
    """The run's selector as the table says it: 'uniform', 'data_size', 'power_of_choice (d = 10)', 'oort (d = 10)'
    (d: `system.candidates`, 'd = 2m' when left at its default, twice the cohort)."""
    selection = selection_of(run)
    if selection not in ("power_of_choice", "oort"):
        return selection
    candidates = (run.config.get("system") or {}).get("candidates")
    return f"{selection} (d = {'2m' if candidates is None else candidates})"


def round_to_target(run: Run, key: str, target: float) -> float | None:
    """The first evaluated round whose `key` reaches `target`, or None."""
    return next((r["round"] for r in run.metrics if r.get(key, -math.inf) >= target), None)


def mean_of_last(run: Run, key: str, rounds: int) -> float | None:
    """The mean of `key` over the run's last `rounds` evaluated rounds, or None when it never logged it."""
    _, values = run.column(key)
    return float(values[-rounds:].mean()) if len(values) else None


def worst_share(run: Run, share: float) -> float | None:
    """The mean test accuracy of the worst `share` of the clients (at least one) at the last evaluated round; a
    client without test samples (its accuracy NaN) counts in neither the share nor the mean."""
    at = run.last_eval_round
    accuracies = (
        sorted(r["acc"] for r in run.clients_at(at) if math.isfinite(r.get("acc", math.nan))) if at is not None else []
    )
    if not accuracies:
        return None
    return float(np.mean(accuracies[: max(1, int(round(share * len(accuracies))))]))


def clients_trained(run: Run) -> float | None:
    """How many distinct clients trained in some round (a finite per-client `train/loss` in clients.csv)."""
    return (
        float(len({r["client"] for r in run.clients if math.isfinite(r.get("train/loss", math.nan))}))
        if run.clients
        else None
    )


def table(runs: Sequence[Run], targets: Sequence[float], last_rounds: int) -> str:
    """The markdown table, one row per (algorithm, selector): algorithms in the order first met, then uniform,
    data size, power-of-choice by d, Oort."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.algorithm, selector_of(run)), []).append(run)
    algorithms = list(dict.fromkeys(key[0] for key in groups))
    kinds = ["uniform", "data_size", "power_of_choice", "oort", "cluster_stratified"]

    def order(key: tuple[str, str]) -> tuple:
        kind, _, d = key[1].partition(" (d = ")
        number = d.rstrip(")")
        return (
            algorithms.index(key[0]),
            kinds.index(kind) if kind in kinds else len(kinds),
            int(number) if number.isdigit() else -1,
            key[1],
        )

    header = [
        "method",
        "selection",
        "seeds",
        "acc mean",
        f"acc mean, last {last_rounds} rounds",
        "acc worst client",
        "acc worst 10 % of clients",
        "ARI",
        *(f"rounds to acc {t:g} (seeds reached)" for t in targets),
        *(f"virtual s to acc {t:g}" for t in targets),
        "virtual s / round",
        "clients ever trained",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for algorithm, selector in sorted(groups, key=order):
        members = groups[(algorithm, selector)]

        def reached(values: list[float | None], digits: int) -> str:
            return cell(values, digits) if any(v is not None for v in values) else f"not reached (0/{len(values)})"

        rounds = [len(r.column("system/virtual_time_s")[1]) for r in members]
        row = [
            algorithm,
            selector,
            str(len(members)),
            cell([last(r, "test/acc_mean") for r in members]),
            cell([mean_of_last(r, "test/acc_mean", last_rounds) for r in members]),
            cell([last(r, "test/acc_worst") for r in members]),
            cell([worst_share(r, 0.1) for r in members]),
            cell([last(r, "cluster/ari") for r in members], 2),
            *(reached([round_to_target(r, "test/acc_mean", t) for r in members], 1) for t in targets),
            *(reached([time_to_target(r, "test/acc_mean", t) for r in members], 1) for t in targets),
            cell([last(r, "system/virtual_time_s") / n if n else None for r, n in zip(members, rounds)], 2),
            cell([clients_trained(r) for r in members], 1),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def figure(runs: Sequence[Run], path: Path) -> None:
    """The mean test accuracy against rounds and against virtual time (each configuration's mean over seeds at each
    round, as the report draws it), saved as an image at `path`."""
    groups = group_runs(runs)
    panels = [
        (title, "accuracy", [s for g in groups if (s := g.curve("test/acc_mean", axis)) is not None])
        for title, axis in (("Mean accuracy over rounds", None), ("Mean accuracy over virtual time", VIRTUAL_TIME))
    ]
    drawn = plots.line_figure(panels, xlabel="virtual time (s)")
    drawn.axes[0].set_xlabel("round")
    drawn.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="run folders, or folders holding them (the sweep's output_dir)")
    parser.add_argument(
        "--targets",
        type=float,
        nargs="+",
        default=[0.6, 0.7],
        help="the mean test accuracies to reach (default 0.6 0.7)",
    )
    parser.add_argument("--last", type=int, default=5, help="the last rounds whose accuracy is averaged (default 5)")
    parser.add_argument("--figure", type=Path, help="also save accuracy against rounds and virtual time (.png)")
    args = parser.parse_args()
    runs = [load_run(Path(p)) for p in find_runs(args.folders)]
    print(table(runs, args.targets, args.last))
    if args.figure:
        figure(runs, args.figure)


if __name__ == "__main__":
    main()
