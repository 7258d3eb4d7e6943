"""Each configuration's final-round metrics over its seeds as means with 95 % Student-t intervals, and, against a
reference configuration run on the same seeds, the paired difference with its interval (`fedlight.reports.intervals`):
a difference whose interval excludes 0 is marked, one that spans 0 is not resolved by these seeds.

    python benchmarks/seed_intervals.py runs/sweep-baselines-skew [--metrics test/acc_mean test/acc_worst]
                                        [--against FedAvg] [--level 0.95]

The groups are the report's (`fedlight.reports.runs.group_runs`: one per configuration); a configuration is named by
its runs' folder name without the seed (a sweep entry's `name`), else by the report's label; `--against` names the
reference (default: the first).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from fedlight.reports.intervals import mean_interval, paired_difference
from fedlight.reports.runs import Group, find_runs, group_runs, load_run
from fedlight.reports.tables import values_by_seed


def name_of(group: Group) -> str:
    """The configuration's name: its runs' folder name without the seed (a sweep entry's `name`, `fedadam-s0` ->
    `fedadam`) when they share one, else the report's label."""
    names = {re.sub(r"-s\d+$", "", run.name) for run in group.runs}
    return names.pop() if len(names) == 1 else group.label


def load_groups(paths: list[str]) -> list[Group]:
    """The report's configurations of the finished runs under `paths` (run folders, or folders holding them): a run
    still going (no summary.json yet) is left out."""
    finished = [path for path in find_runs([Path(p) for p in paths]) if (Path(path) / "summary.json").is_file()]
    return group_runs([load_run(path) for path in finished])


def finals(group: Group, metric: str) -> dict[int, float]:
    """seed -> the run's final value of `metric`."""
    return values_by_seed(group, lambda run: run.final(metric))


def table(groups: list[Group], metrics: list[str], against: Group, level: float) -> str:
    """The markdown table: one row per group, for each metric its mean ± half-width and the paired difference."""
    percent = f"{level:.0%}"
    header = ["configuration", "seeds"]
    for metric in metrics:
        header += [f"{metric} ({percent} interval)", f"- {name_of(against)} (paired)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group in groups:
        cells = [name_of(group), str(len(group.runs))]
        for metric in metrics:
            mine, theirs = finals(group, metric), finals(against, metric)
            cells.append(mean_interval(list(mine.values()), level).text() if mine else "–")
            if group is against or not mine or not set(mine) & set(theirs):
                cells.append("")
                continue
            difference = paired_difference(mine, theirs, level)
            cells.append(f"{difference.text()}{' *' if difference.excludes_zero() else ''}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="run folders, or folders holding them (a sweep's output_dir)")
    parser.add_argument("--metrics", nargs="+", default=["test/acc_mean", "test/acc_worst"])
    parser.add_argument("--against", default=None, help="the reference configuration's label (default: the first)")
    parser.add_argument("--level", type=float, default=0.95)
    args = parser.parse_args(argv)
    groups = load_groups(args.paths)
    if not groups:
        print("no runs found", file=sys.stderr)
        return 1
    labels = [name_of(g) for g in groups]
    if args.against is not None and args.against not in labels:
        print(f"no configuration labelled {args.against!r}: choose one of {', '.join(labels)}", file=sys.stderr)
        return 1
    against = groups[labels.index(args.against)] if args.against else groups[0]
    print(table(groups, args.metrics, against, args.level))
    print(
        f"\n* the paired difference's {args.level:.0%} interval excludes 0. Final-round values; intervals "
        "mean ± t s / sqrt(n) over the seeds."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
