"""Virtual time (the `system:` section's clock) each run needs to reach target mean accuracies, from run folders.

    python benchmarks/virtual_time_to_accuracy.py runs/fedbuff-vs-sync --targets 0.8 0.85 --group fedbuff sync

Reads each run's metrics.csv (`system/virtual_time_s`, `test/acc_mean` or `--metric`) and prints, per group of run
folders whose names start with the group's name, the mean ± std over its runs of: the virtual seconds at the first
evaluated round whose accuracy reaches each target (runs that never reach it are counted and left out of the mean),
the final accuracy and the total virtual time.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np


def first_time_at(rows: list[dict[str, str]], metric: str, target: float) -> float | None:
    """The virtual time of the first round whose `metric` reaches `target` (None: never)."""
    for row in rows:
        value = row.get(metric, "")
        if value and float(value) >= target:
            return float(row["system/virtual_time_s"])
    return None


def summary(values: list[float]) -> str:
    return f"{np.mean(values):.1f} ± {np.std(values):.1f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.8])
    parser.add_argument("--group", nargs="+", required=True, help="run-name prefixes, one row each")
    parser.add_argument("--metric", default="test/acc_mean")
    args = parser.parse_args()
    print("| runs | " + " | ".join(f"virtual s to {t}" for t in args.targets) + " | final acc | total virtual s |")
    print("|---" * (len(args.targets) + 3) + "|")
    for group in args.group:
        runs = [list(csv.DictReader(path.open())) for path in sorted(args.root.glob(f"{group}-s*/metrics.csv"))]
        cells = []
        for target in args.targets:
            times = [first_time_at(rows, args.metric, target) for rows in runs]
            reached = [t for t in times if t is not None]
            missed = len(times) - len(reached)
            cells.append(summary(reached) + (f" ({missed} of {len(times)} never)" if missed else ""))
        finals = [float(rows[-1][args.metric]) for rows in runs]
        totals = [float(rows[-1]["system/virtual_time_s"]) for rows in runs]
        print(
            f"| {group} ({len(runs)}) | "
            + " | ".join(cells)
            + f" | {np.mean(finals):.3f} ± {np.std(finals):.3f} | {summary(totals)} |"
        )


if __name__ == "__main__":
    main()
