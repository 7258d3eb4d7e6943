"""The table of configs/sweeps/system_stragglers.yaml: per method and selection (`system.selection`), the mean and
standard deviation over seeds (one row per method, deadline and selection) of the last round's mean and worst-client
test accuracy, the accuracy of the slow cluster (its true cluster's mean, `cluster_acc/true_<k>`), the ARI of the
found clusters against the true ones, the virtual time to reach each target mean accuracy (with how many seeds reached
it) and the total virtual time, read from the run folders' metrics.csv alone (docs/system_experiments.md).

    python -m fedlight sweep --config configs/sweeps/system_stragglers.yaml
    python benchmarks/system_stragglers.py runs/sweep-system-stragglers [--targets 0.7 0.8] [--slow_cluster 3] \
        [--figure accuracy_time.png]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedlight.reports import plots
from fedlight.reports.runs import VIRTUAL_TIME, Run, find_runs, group_runs, load_run


def last(run: Run, key: str) -> float | None:
    """The last metrics row's value of `key`, or None when the run never logged it."""
    _, values = run.column(key)
    return float(values[-1]) if len(values) else None


def time_to_target(run: Run, key: str, target: float) -> float | None:
    """The virtual seconds at the end of the first evaluated round whose `key` reaches `target`, or None."""
    rows = [r for r in run.metrics if key in r and "system/virtual_time_s" in r]
    return next((r["system/virtual_time_s"] for r in rows if r[key] >= target), None)


def selection_of(run: Run) -> str:
    """The run's `system.selection` ("uniform" when the config has no system section or leaves it at its default)."""
    return str((run.config.get("system") or {}).get("selection", "uniform"))


def deadline_of(run: Run) -> str:
    """The run's deadline as the table says it: 'none', '3 s' (stragglers dropped), '3 s, partial work', 'p80'."""
    system = run.config.get("system") or {}
    seconds, percentile = system.get("deadline_s"), system.get("deadline_percentile")
    if seconds is None and percentile is None:
        return "none"
    at = f"{seconds:g} s" if seconds is not None else f"p{percentile:g}"
    return f"{at}, partial work" if system.get("partial_work") else at


def cell(values: Sequence[float | None], digits: int = 3) -> str:
    """Mean ± standard deviation over the seeds that have a value; '–' when none has."""
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    mean, std = float(np.mean(present)), float(np.std(present))
    text = f"{mean:.{digits}f} ± {std:.{digits}f}" if len(present) > 1 else f"{mean:.{digits}f}"
    return text if len(present) == len(values) else f"{text} ({len(present)}/{len(values)})"


def table(runs: Sequence[Run], targets: Sequence[float], slow_cluster: int) -> str:
    """The markdown table, one row per (algorithm, deadline, selection): algorithms and deadlines in the order first
    met, uniform selection first."""
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.algorithm, deadline_of(run), selection_of(run)), []).append(run)
    algorithms = list(dict.fromkeys(key[0] for key in groups))
    deadlines = list(dict.fromkeys(key[1] for key in groups))
    order = sorted(
        groups, key=lambda key: (algorithms.index(key[0]), deadlines.index(key[1]), key[2] != "uniform", key[2])
    )
    header = [
        "method",
        "deadline",
        "selection",
        "seeds",
        "acc mean",
        "acc worst client",
        f"acc slow cluster ({slow_cluster})",
        "ARI",
        *(f"virtual s to acc {t:g} (seeds reached)" for t in targets),
        "virtual s total",
        "dropped by deadline / round",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for algorithm, deadline, selection in order:
        members = groups[(algorithm, deadline, selection)]
        rounds = [len(r.column("system/dropped_deadline")[1]) for r in members]
        dropped = [
            float(r.column("system/dropped_deadline")[1].sum()) / n if n else None for r, n in zip(members, rounds)
        ]
        reached = [[time_to_target(r, "test/acc_mean", t) for r in members] for t in targets]
        row = [
            algorithm,
            deadline,
            selection,
            str(len(members)),
            cell([last(r, "test/acc_mean") for r in members]),
            cell([last(r, "test/acc_worst") for r in members]),
            cell([last(r, f"cluster_acc/true_{slow_cluster}") for r in members]),
            cell([last(r, "cluster/ari") for r in members], 2),
            *(
                cell(times, 1) if any(v is not None for v in times) else f"not reached (0/{len(members)})"
                for times in reached
            ),
            cell([last(r, "system/virtual_time_s") for r in members], 1),
            cell(dropped, 2),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def figure(runs: Sequence[Run], slow_cluster: int, path: Path) -> None:
    """The mean test accuracy and the slow cluster's against the virtual time (each configuration's mean over seeds
    at each round, as the report draws it), saved as an image at `path`."""
    groups = group_runs(runs)
    panels = [
        (title, "accuracy", [s for g in groups if (s := g.curve(key, VIRTUAL_TIME)) is not None])
        for title, key in (
            ("Mean accuracy over clients", "test/acc_mean"),
            (f"Slow cluster ({slow_cluster})", f"cluster_acc/true_{slow_cluster}"),
        )
    ]
    plots.line_figure(panels, xlabel="virtual time (s)").savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="run folders, or folders holding them (the sweep's output_dir)")
    parser.add_argument(
        "--targets",
        type=float,
        nargs="+",
        default=[0.7, 0.8],
        help="the mean test accuracies to time (default 0.7 0.8)",
    )
    parser.add_argument(
        "--slow_cluster",
        type=int,
        default=3,
        help="the true cluster of the slow clients (default 3: the 270-degree rotation)",
    )
    parser.add_argument("--figure", type=Path, help="also save accuracy against virtual time to this image (.png)")
    args = parser.parse_args()
    runs = [load_run(Path(p)) for p in find_runs(args.folders)]
    print(table(runs, args.targets, args.slow_cluster))
    if args.figure:
        figure(runs, args.slow_cluster, args.figure)


if __name__ == "__main__":
    main()
