"""README's method table from a sweep's runs: every configuration ranked by its validation-selected mean test
accuracy, each number a mean over seeds with its 95 % Student-t interval, each method's paired difference to a
reference (FedAvg) and to the best, and under the table what says whether the setting separates the methods (the
best against the median method, paired over seeds), the resolution of an accuracy and the Bayes rule's accuracy
when the data module knows it (`info["oracle_test_acc"]`, e.g. `SyntheticMixture`).

    python -m fedlight sweep --config configs/sweeps/synthetic_mixture.yaml --jobs 2
    python benchmarks/method_table.py runs/sweep-synthetic-mixture [--against fedavg] [--level 0.95]

A configuration is named by its runs' folder name without the seed (a sweep entry's `name`,
`benchmarks/seed_intervals.py`'s `name_of`). The "= best" mark: the paired interval of the difference to the best
configuration includes 0, so these seeds do not tell the two apart; "*": the paired difference to the reference
excludes 0.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from seed_intervals import load_groups, name_of

from fedlight.reports.intervals import Interval, mean_interval, paired_difference
from fedlight.reports.runs import Group, Run
from fedlight.reports.tables import values_by_seed

SELECTED = "val_selected/test/acc_mean"
SELECTED_WORST = "val_selected/test/acc_worst"
LAST = "test/acc_mean"


def summary_value(key: str) -> Callable[[Run], float | None]:
    """A run's summary.json value of `key` (None when absent)."""

    def value(run: Run) -> float | None:
        found = run.summary.get(key)
        return float(found) if isinstance(found, int | float) else None

    return value


def by_seed(group: Group, key: str) -> dict[int, float]:
    """seed -> the run's summary value of `key`."""
    return values_by_seed(group, summary_value(key))


def cell(values: dict[int, float], level: float) -> str:
    """'0.812 ± 0.004' (mean ± the t half-width over seeds), '–' without values."""
    return mean_interval(list(values.values()), level).text() if values else "–"


def difference_cell(mine: dict[int, float], theirs: dict[int, float], level: float, mark: str) -> tuple[str, bool]:
    """The paired difference over the shared seeds ('+0.012 ± 0.004' with `mark` when its interval excludes 0) and
    whether it does; ('', False) without two shared seeds."""
    if len(set(mine) & set(theirs)) < 2:
        return "", False
    difference: Interval = paired_difference(mine, theirs, level)
    separated = difference.excludes_zero()
    return f"{difference.text()}{mark if separated else ''}", separated


def oracle(run: Run) -> float | None:
    """The Bayes rule's mean client accuracy on the run's data, when its data module reports one: the module is
    rebuilt from the run's config.yaml with the run's seed."""
    config_path = Path(run.path) / "config.yaml"
    if not config_path.is_file():
        return None
    config = yaml.safe_load(config_path.read_text())
    data = config.get("data") or {}
    module_name, _, class_name = str(data.get("class_path", "")).rpartition(".")
    if not module_name:
        return None
    module = getattr(importlib.import_module(module_name), class_name)(**(data.get("init_args") or {}))
    module.seed = int(config.get("seed", 0))
    found = module.build().info.get("oracle_test_acc")
    return float(found) if found is not None else None


def table(groups: list[Group], against: Group, level: float) -> tuple[str, list[Group]]:
    """The markdown table, best first, and the groups in its order."""
    ranked = sorted(groups, key=lambda g: -np.mean(list(by_seed(g, SELECTED).values()) or [-np.inf]))
    best = by_seed(ranked[0], SELECTED)
    reference = name_of(against)
    header = [
        "rank",
        "method",
        "test acc, val-selected",
        "worst client",
        "last round",
        f"− {reference}",
        "− best",
        "ARI",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, group in enumerate(ranked, 1):
        mine = by_seed(group, SELECTED)
        to_reference = "" if group is against else difference_cell(mine, by_seed(against, SELECTED), level, " *")[0]
        if group is ranked[0]:
            to_best = "best"
        else:
            text, separated = difference_cell(mine, best, level, "")
            to_best = text if separated or not text else f"{text} = best"
        lines.append(
            "| "
            + " | ".join(
                [
                    str(rank),
                    name_of(group),
                    cell(mine, level),
                    cell(by_seed(group, SELECTED_WORST), level),
                    cell(by_seed(group, LAST), level),
                    to_reference,
                    to_best,
                    cell(by_seed(group, "cluster/ari"), level),
                ]
            )
            + " |"
        )
    return "\n".join(lines), ranked


def footer(ranked: list[Group], level: float) -> str:
    """Whether the setting separates the methods (best against median, paired over seeds), the resolution of one
    test sample, and the Bayes rule's accuracy where known."""
    best, median = ranked[0], ranked[len(ranked) // 2]
    text, separated = difference_cell(by_seed(best, SELECTED), by_seed(median, SELECTED), level, "")
    lines = [
        f"Best ({name_of(best)}) − median ({name_of(median)}): {text or '–'}, "
        f"{'separated' if separated else 'NOT separated'} at {percent(level)}."
    ]
    resolutions = [v for g in ranked for r in g.runs if (v := summary_value("test/acc_resolution")(r)) is not None]
    if resolutions:
        lines.append(f"One test sample moves the median client's accuracy by {np.median(resolutions):.4f}.")
    oracles = {r.seed: o for r in ranked[0].runs if r.seed is not None and (o := oracle(r)) is not None}
    if oracles:
        lines.append(
            f"The Bayes rule that knows the mixture: {mean_interval(list(oracles.values()), level).text()} "
            "(mean client accuracy, the same test samples)."
        )
    lines.append(
        f"Each cell: mean ± the {percent(level)} Student-t half-width over {len(ranked[0].runs)} seeds; "
        "differences paired over seeds; * the difference to the reference excludes 0; "
        "'= best': not told apart from the best."
    )
    return "\n".join(lines)


def percent(level: float) -> str:
    """0.95 -> '95 %'."""
    return f"{level * 100:g} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="run folders, or folders holding them (a sweep's output_dir)")
    parser.add_argument("--against", default="fedavg", help="the reference configuration's name (default: fedavg)")
    parser.add_argument("--level", type=float, default=0.95)
    args = parser.parse_args(argv)
    groups = load_groups(args.paths)
    if not groups:
        print("no runs found", file=sys.stderr)
        return 1
    names = [name_of(g) for g in groups]
    if args.against not in names:
        print(f"no configuration named {args.against!r}: choose one of {', '.join(names)}", file=sys.stderr)
        return 1
    text, ranked = table(groups, groups[names.index(args.against)], args.level)
    print(text)
    print()
    print(footer(ranked, args.level))
    return 0


if __name__ == "__main__":
    sys.exit(main())
