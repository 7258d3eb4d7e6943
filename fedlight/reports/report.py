"""`fedlight report RUN [RUN ...] [--output report.html]`: one self-contained HTML page that compares runs, the kind
a paper's appendix holds. A folder argument stands for every run folder below it, at any depth (a sweep writes its
runs one level deeper). Runs whose configs differ only in seed form one configuration (`config_group`, the same
key as their W&B group) and are shown as mean ± their 95 % interval over their runs; two runs of one seed are two runs
(repeats), never two seeds, and the table says so. The page goes to report.html in the folder that holds the runs unless
`--output` says otherwise, and never replaces an existing file without `--overwrite`. It has a comparison table
(final mean, std and worst-client accuracy, the val-selected and test-selected accuracy with their worst clients,
ARI, clusters, wall time) with the ranking under it, and figures drawn by matplotlib and inlined
as SVG: accuracy over rounds (mean and worst client), and over virtual time for runs with a `system:` section, the
per-client spread at the end, ARI over rounds, each clustered run's assignment timeline beside the true clusters, and
the last similarity matrices on a fixed colour scale."""

from __future__ import annotations

import csv
import html
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedlight.plugin.evaluation import UNSEEN, higher_is_better
from fedlight.reports import plots, selection
from fedlight.reports.intervals import mean_interval, paired_difference
from fedlight.reports.run_groups import RUN_ONLY_KEYS, config_group


#: the cumulative virtual time a run with a `system:` section logs every round (`fedlight.system.system_model`)
VIRTUAL_TIME = "system/virtual_time_s"


class ReportError(ValueError):
    """A run folder or option the report cannot use; the message names the problem and the fix."""


def plural(count: int, word: str) -> str:
    """'1 run', '2 runs': a count with its noun in the right number."""
    return f"{count} {word}{'s' * (count != 1)}"


def _number(text: str | None) -> float | None:
    if text in ("True", "False"):  # a flag column (held_out)
        return float(text == "True")
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def read_rows(path: Path) -> list[dict[str, float]]:
    """A CSV written by the recorder as rows of numbers (True/False as 1/0; empty and other non-numeric cells left
    out)."""
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [
            {k: v for k, v in ((k, _number(t)) for k, t in row.items()) if v is not None} for row in csv.DictReader(f)
        ]


@dataclass
class Run:
    """One run folder as `fedlight fit` leaves it: metrics.csv, clients.csv, summary.json, config.yaml,
    matrices/."""

    path: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    metrics: list[dict[str, float]]
    clients: list[dict[str, float]]

    @property
    def name(self) -> str:
        """The run's name: summary.json's `run`, else the folder's name."""
        return str(self.summary.get("run", self.path.name))

    @property
    def algorithm(self) -> str:
        """The algorithm's class name: summary.json's, else the last part of the config's `class_path` ('run' when
        neither names one)."""
        algorithm = self.config.get("algorithm")
        path = algorithm.get("class_path") if isinstance(algorithm, dict) else algorithm
        return str(self.summary.get("algorithm") or (path or "run").rsplit(".", 1)[-1])

    @property
    def seed(self) -> int | None:
        """The run's seed: summary.json's, else the config's; None when neither has one."""
        seed = self.summary.get("seed", self.config.get("seed"))
        return None if seed is None else int(seed)

    @property
    def group(self) -> str:
        """The configuration the run belongs to (`config_group`: the algorithm and a hash of the config without the
        run-only keys); a run without a config is a group of its own."""
        return config_group(self.config, self.algorithm) if self.config else f"{self.algorithm}-{self.path}"

    @cached_property
    def split(self) -> str:
        """The evaluated split: the config's, or the one the metrics name."""
        split = (self.config.get("federation") or {}).get("eval_split")
        if split:
            return split
        keys = [k for row in self.metrics for k in row if k.endswith("_mean")]
        return keys[0].split("/", 1)[0] if keys else "test"

    @cached_property
    def selected(self) -> dict[str, Any]:
        """The numbers of the rounds chosen on validation data and on the evaluated split (`val_selected/...`,
        `<split>_selected/...`, `no_val_selection`: `fedlight.reports.selection`): summary.json's, else chosen
        here over metrics.csv's evaluated rows (a run not finished, or recorded before runs chose)."""
        own = selection.selected_prefix(self.split)
        if f"{own}/round" in self.summary:
            return {
                k: v
                for k, v in self.summary.items()
                if k.startswith((f"{own}/", f"{selection.VAL_SELECTED}/")) or k == selection.NO_VAL_SELECTION
            }
        return selection.selections(self.metrics, self.split, primary_metric(self))

    def column(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(rounds, values) of the metrics rows that have `key`."""
        rows = [r for r in self.metrics if key in r]
        return np.array([r["round"] for r in rows], dtype=int), np.array([r[key] for r in rows])

    def final(self, key: str) -> float | None:
        """The run's final value of `key`: from summary.json, else the last metrics row that has it."""
        if isinstance(self.summary.get(key), (int, float)):
            return float(self.summary[key])
        _, values = self.column(key)
        return float(values[-1]) if len(values) else None

    @property
    def wall_time(self) -> float:
        """Seconds of training: summary.json's, else the sum of the round times (an unfinished run)."""
        if "wall_time_s" in self.summary:
            return float(self.summary["wall_time_s"])
        return float(self.column("time/round_s")[1].sum())

    def clients_at(self, round: int) -> list[dict[str, float]]:
        """clients.csv's rows of round `round`."""
        return [r for r in self.clients if r["round"] == round]

    @property
    def last_eval_round(self) -> int | None:
        """The last round clients.csv has rows of, or None when it has none."""
        return int(max(r["round"] for r in self.clients)) if self.clients else None

    def timeline(self) -> plots.Timeline | None:
        """Each client's cluster at each evaluated round, with the true clusters, when the algorithm clusters."""
        rounds = sorted({int(r["round"]) for r in self.clients if "cluster" in r})
        if not rounds:
            return None
        clients = int(max(r["client"] for r in self.clients)) + 1
        column = {round: i for i, round in enumerate(rounds)}
        assigned = np.full((clients, len(rounds)), -1)
        for r in self.clients:
            if "cluster" in r:
                assigned[int(r["client"]), column[int(r["round"])]] = int(r["cluster"])
        last = {int(r["client"]): r for r in self.clients_at(rounds[-1])}
        true = (
            np.array([last[c]["true_cluster"] for c in range(clients)], dtype=int)
            if all("true_cluster" in last.get(c, {}) for c in range(clients))
            else None
        )
        return plots.Timeline(self.name, np.array(rounds), assigned, true)

    def matrices(self) -> dict[str, list[Path]]:
        """Saved matrices by name, each name's files in round order."""
        found: dict[str, list[Path]] = {}
        for path in sorted((self.path / "matrices").glob("*_round*.npy")):
            found.setdefault(path.stem.rsplit("_round", 1)[0], []).append(path)
        return found


def runs_below(folder: Path, seen: set[Path] | None = None) -> list[Path]:
    """The run folders (those holding metrics.csv) at or below `folder` at any depth, in path order. The search
    stops at a run folder (its wandb/ and matrices/ are not runs), skips hidden folders (.git, .venv) and visits a
    folder reached twice through links once."""
    seen = set() if seen is None else seen
    if folder.resolve() in seen:
        return []
    seen.add(folder.resolve())
    if (folder / "metrics.csv").is_file():
        return [folder]
    children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    return [run for child in children for run in runs_below(child, seen)]


def find_runs(paths: Sequence[str | Path]) -> list[Path]:
    """Run folders: each path itself when it holds metrics.csv, else every run folder below it (a folder of runs,
    or of sweeps of runs); a path holding no run at all is refused, naming it."""
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise ReportError(f"{path}: no such folder; pass run folders written by `fedlight fit` (runs/<run>)")
        runs = runs_below(path)
        if not runs:
            raise ReportError(
                f"{path} holds no run (no metrics.csv in it or in any folder below it): pass run "
                "folders written by `fedlight fit` (runs/<run>) or a folder that holds them"
            )
        found.extend(runs)
    unique: dict[Path, Path] = {}
    for run in found:  # a run given twice (or by two paths) is one run
        unique.setdefault(run.resolve(), run)
    return list(unique.values())


def load_run(path: Path) -> Run:
    """Read one run folder; a run without an evaluated round is refused (nothing to compare)."""
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    config = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
    clients = [r for r in read_rows(path / "clients.csv") if not r.get("held_out")]  # the training clients
    run = Run(path, summary, config or {}, read_rows(path / "metrics.csv"), clients)
    if not any(k.endswith("_mean") for row in run.metrics for k in row):
        raise ReportError(
            f"{path / 'metrics.csv'} has no evaluated round yet: let the run reach an evaluation "
            "(federation.eval_every) or leave it out"
        )
    return run


@dataclass
class Group:
    """The runs of one configuration, drawn in one colour under one label. Two runs of one seed are kept as two
    runs (repeats): every number is a mean ± its 95 % interval over the runs, and `seeds` says how many runs of which
    seeds."""

    key: str
    label: str
    colour: str
    runs: list[Run]

    @property
    def first(self) -> Run:
        """The run shown where a figure shows one run per configuration: the lowest seed."""
        return self.runs[0]

    @property
    def repeats(self) -> bool:
        """Whether some seed was run more than once, so that the runs outnumber the seeds."""
        return len({run.seed for run in self.runs}) < len(self.runs)

    @property
    def seeds(self) -> str:
        """'seed 0', 'seeds 0, 1', and with repeats 'seed 0 (2 runs)', 'seeds 0, 1 (3 runs)': a repeat of a seed is
        another run, never another seed."""
        seeds = list(dict.fromkeys("unset" if run.seed is None else str(run.seed) for run in self.runs))
        text = f"seed{'s' * (len(seeds) > 1)} {', '.join(seeds)}"
        return f"{text} ({plural(len(self.runs), 'run')})" if self.repeats else text

    def curve(self, key: str, against: str | None = None) -> plots.Series | None:
        """`key` over the rounds every run has: the mean over runs, with their std when there are several, at each
        round, or with `against` (a column every round logs, `system/virtual_time_s`) at the runs' mean value of it
        in that round (of the runs that log it)."""
        pairs = [(run.column(key), run.column(against) if against else None) for run in self.runs]
        pairs = [(c, x) for c, x in pairs if len(c[0]) and (x is None or len(x[0]))]
        if not pairs:
            return None
        rounds = sorted(
            set.intersection(
                *(set(r.tolist()) for (r, _), x in pairs), *(set(x[0].tolist()) for _, x in pairs if x is not None)
            )
        )
        values = np.stack([v[np.searchsorted(r, rounds)] for (r, v), _ in pairs])
        measured = [x for _, x in pairs if x is not None]  # each run's `against` column
        at = (
            np.array(rounds)
            if against is None
            else np.stack([v[np.searchsorted(r, rounds)] for r, v in measured]).astype(float).mean(axis=0)
        )
        if len(values) == 1:
            return plots.Series(self.label, self.colour, at, values[0])
        return plots.Series(
            self.label, self.colour, at, values.mean(axis=0), values.std(axis=0), values.min(axis=0), values.max(axis=0)
        )


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Runs grouped by configuration (in order of first appearance), sorted by seed; runs of one seed stay separate
    runs (see `Group`). A label is the algorithm's name, plus the settings that tell apart configurations of the
    same algorithm."""
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(run.group, []).append(run)
    palette = plots.colours(len(by_key))
    groups = [
        Group(key, members[0].algorithm, colour, sorted(members, key=lambda r: (r.seed is None, r.seed or 0)))
        for (key, members), colour in zip(by_key.items(), palette)
    ]
    for algorithm in {g.label for g in groups}:
        same = [g for g in groups if g.label == algorithm]
        if len(same) < 2:
            continue
        settings = [_flatten({k: v for k, v in g.first.config.items() if k not in RUN_ONLY_KEYS}) for g in same]
        keys = dict.fromkeys(k for s in settings for k in s)
        differ = [k for k in keys if len({repr(s.get(k)) for s in settings}) > 1]
        for group, setting in zip(same, settings):
            shown = ", ".join(f"{k.rsplit('.', 1)[-1]}={setting.get(k)}" for k in differ[:3])
            group.label = f"{algorithm} ({shown or group.key})"
    return groups


# -- the comparison table ------------------------------------------------------------------------------------
@dataclass
class Column:
    """A column of Table 1: its header, a run's value, and for a run without one why (shown when no run of a
    configuration has it; '–' otherwise)."""

    header: str
    value: Callable[[Run], float | None]
    digits: int = 3
    absent: Callable[[Run], str | None] | None = None

    def missing(self, group: "Group") -> str:
        """What a cell shows when no run of `group` has a value: the runs' reasons, else '–'."""
        reasons = [] if self.absent is None else [r for r in map(self.absent, group.runs) if r]
        return "; ".join(dict.fromkeys(reasons)) or "–"


def table_columns(
    split: str, metric: str, unseen: bool = False, fine_tuned: bool = False, private: bool = False
) -> list[Column]:
    """The comparison's columns; `unseen` adds the held-out clients' mean and worst-client metric and ARI,
    `fine_tuned` the mean and worst client of the models each client fine-tuned (`federation.finetune_epochs`),
    `private` the privacy spent (epsilon, client-level DP)."""
    name = "acc" if metric == "acc" else metric
    tuned = (
        [
            Column(f"fine-tuned {name}", lambda r: r.final(f"{split}_ft/{metric}_mean")),
            Column(f"worst fine-tuned {name}", lambda r: r.final(f"{split}_ft/{metric}_worst")),
        ]
        if fine_tuned
        else []
    )
    held_out = (
        [
            Column(f"unseen {name}", lambda r: r.final(f"{UNSEEN}/{metric}_mean")),
            Column(f"worst unseen {name}", lambda r: r.final(f"{UNSEEN}/{metric}_worst")),
            Column("unseen ARI", lambda r: r.final(f"{UNSEEN}/ari")),
        ]
        if unseen
        else []
    )
    return [
        Column(f"mean {name}", lambda r: r.final(f"{split}/{metric}_mean")),
        Column(f"std {name} (clients)", lambda r: r.final(f"{split}/{metric}_std")),
        Column(f"worst-client {name}", lambda r: r.final(f"{split}/{metric}_worst")),
        *selected_columns(split, metric),
        *tuned,
        Column("ARI", lambda r: r.final("cluster/ari")),
        Column("clusters", lambda r: r.final("cluster/count"), 1),
        *held_out,
        *([Column("epsilon", lambda r: r.final("privacy/epsilon"), 2)] if private else []),
        Column("wall time (s)", lambda r: r.wall_time, 1),
    ]


def selected_value(key: str) -> Callable[[Run], float | None]:
    """A run's value of `key` at its selected round (None: it has none)."""
    return lambda r: r.selected.get(key)


def selected_columns(split: str, metric: str) -> list[Column]:
    """The mean and worst client at the round chosen on validation data and, unless that is the evaluated split,
    at the best round on the evaluated split itself (`fedlight.reports.selection`)."""
    name = "acc" if metric == "acc" else metric
    why = lambda r: r.selected.get(selection.NO_VAL_SELECTION)  # noqa: E731
    columns = []
    for prefix in dict.fromkeys((selection.VAL_SELECTED, selection.selected_prefix(split))):
        label = prefix.replace("_", "-")
        columns += [
            Column(
                f"{label} {name}",
                selected_value(f"{prefix}/{split}/{metric}_mean"),
                absent=why if prefix == selection.VAL_SELECTED else None,
            ),
            Column(
                f"{label} worst-client {name}",
                selected_value(f"{prefix}/{split}/{metric}_worst"),
                absent=why if prefix == selection.VAL_SELECTED else None,
            ),
        ]
    return columns


def headline(groups: Sequence[Group], split: str, metric: str) -> tuple[Column, str]:
    """The column configurations are compared and ranked by, and why: the validation-selected mean when every run
    has one, else the last round's mean."""
    chosen = selected_columns(split, metric)[0]
    without = [run for g in groups for run in g.runs if chosen.value(run) is None]
    if not without:
        return chosen, "every run chose its round on validation data"
    names = ", ".join(run.name for run in without[:3]) + (", ..." if len(without) > 3 else "")
    return (
        table_columns(split, metric)[0],
        f"the last round: {plural(len(without), 'run')} ({names}) {'has' if len(without) == 1 else 'have'} no "
        "validation-selected round",
    )


def ranking(groups: Sequence[Group], column: Column, metric: str) -> list[tuple[int, Group, float | None]]:
    """(rank, configuration, its mean over runs of `column`), best first; a tie shares its rank, and a
    configuration without a value comes last without one."""
    means = [(g, float(np.mean(v)) if (v := _values(g, column)) else None) for g in groups]
    sign = 1 if higher_is_better(metric) else -1
    known = sorted(((g, m) for g, m in means if m is not None), key=lambda entry: -sign * entry[1])
    ranked = [(1 + sum(sign * other > sign * value for _, other in known), g, value) for g, value in known]
    return ranked + [(0, g, None) for g, value in means if value is None]


def ranking_text(groups: Sequence[Group], split: str, metric: str) -> str:
    """'Ranked by val-selected acc (every run chose its round on validation data): 1. OCFL 0.912; 2. FedAvg 0.850.',
    then, where neighbours in the ranking share two or more seeds, which of their gaps those seeds resolve
    (`resolution`)."""
    column, why = headline(groups, split, metric)
    ranked = ranking(groups, column, metric)
    places = "; ".join(
        f"{rank}. {g.label} {value:.{column.digits}f}" if value is not None else f"{g.label} –"
        for rank, g, value in ranked
    )
    return (
        f"Ranked by {column.header} ({why}): {places}.{resolution([g for _, g, v in ranked if v is not None], column)}"
    )


def resolution(ranked: Sequence[Group], column: Column) -> str:
    """' Resolved by the seeds: A over B. Not resolved: B and C.' for each pair of neighbours in `ranked` that share
    two or more seeds: resolved when the 95 % interval of their paired difference over those seeds excludes 0
    (`fedlight.reports.intervals.paired_difference`); '' when no pair shares two seeds."""
    resolved: list[tuple[str, str]] = []
    unresolved: list[tuple[str, str]] = []
    for upper, lower in zip(ranked, ranked[1:]):
        mine, theirs = values_by_seed(upper, column.value), values_by_seed(lower, column.value)
        if len(set(mine) & set(theirs)) < 2:
            continue
        pair = (upper.label, lower.label)
        (resolved if paired_difference(mine, theirs).excludes_zero() else unresolved).append(pair)
    text = ""
    if resolved:
        text += (
            " Resolved by the seeds (paired 95 % interval): " + ", ".join(f"{a} over {b}" for a, b in resolved) + "."
        )
    if unresolved:
        text += " Not resolved: " + ", ".join(f"{a} and {b}" for a, b in unresolved) + "."
    return text


def values_by_seed(group: Group, value: Callable[[Run], float | None]) -> dict[int, float]:
    """seed -> `value` of the group's run of that seed (runs without a seed or a finite value left out; a repeated
    seed: its first run): what a paired comparison over seeds reads."""
    values: dict[int, float] = {}
    for run in group.runs:
        found = value(run)
        if run.seed is not None and found is not None and np.isfinite(found):
            values.setdefault(run.seed, found)
    return values


def has_final(groups: Sequence[Group], key: str) -> bool:
    """Whether some run has a final value of `key` (held-out clients, fine-tuning, privacy)."""
    return any(run.final(key) is not None for g in groups for run in g.runs)


def optional_columns(groups: Sequence[Group], split: str, metric: str) -> tuple[bool, bool, bool]:
    """Whether some run has held-out clients, fine-tuned models, a privacy budget: Table 1 shows those columns."""
    return (
        has_final(groups, f"{UNSEEN}/{metric}_mean"),
        has_final(groups, f"{split}_ft/{metric}_mean"),
        has_final(groups, "privacy/epsilon"),
    )


def _values(group: Group, column: Column) -> list[float]:
    return [v for v in map(column.value, group.runs) if v is not None and np.isfinite(v)]


def _text(values: list[float], digits: int) -> str:
    """'mean ± h' over runs, h the half-width of the mean's 95 % Student-t interval (`fedlight.reports.intervals`);
    the value alone for one run, '–' for none."""
    if not values:
        return "–"
    return mean_interval(values).text(digits)


def _cell(values: list[float], digits: int, missing: str = "–") -> str:
    """`_text` as a cell (`missing` without a value); the exact numbers ride along as data attributes (data-std: the
    population std over runs, data-half: the interval's half-width, data-n: the number of runs)."""
    if not values:
        return f"<td class='num'>{html.escape(missing)}</td>"
    interval = mean_interval(values)
    mean, std = float(np.mean(values)), float(np.std(values))
    return (
        f"<td class='num' data-mean='{mean!r}' data-std='{std!r}' data-n='{len(values)}' "
        f"data-half='{interval.half_width!r}'>{interval.text(digits)}</td>"
    )


def _rounds(group: Group) -> str:
    return "/".join(map(str, sorted({int(r.final("rounds") or r.column("round")[1].max()) for r in group.runs})))


def console_table(groups: Sequence[Group]) -> Any:
    """Table 1 of the report for the console (a rich Table): what `fedlight sweep` and `fedlight report` print."""
    from rich.table import Table

    first = groups[0].first
    split, metric = first.split, primary_metric(first)
    columns = table_columns(split, metric, *optional_columns(groups, split, metric))
    table = Table(title=f"final round, {first.split} split", caption=ranking_text(groups, split, metric))
    for header in ("configuration", "runs", "rounds", *(c.header for c in columns)):
        table.add_column(header, justify="left" if header in ("configuration", "runs") else "right")
    for g in groups:
        table.add_row(
            g.label,
            g.seeds,
            _rounds(g),
            *(_text(v, c.digits) if (v := _values(g, c)) else c.missing(g) for c in columns),
        )
    return table


def comparison_table(groups: Sequence[Group], columns: Sequence[Column]) -> str:
    """Table 1 as HTML: a row per configuration (its label and colour, runs, rounds) and a cell of 'mean ± h' over its
    runs per column of `columns`."""
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in columns)
    rows = []
    for g in groups:
        cells = "".join(_cell(_values(g, c), c.digits, c.missing(g)) for c in columns)
        rounds = _rounds(g)
        rows.append(
            f"<tr data-group='{html.escape(g.key)}'><th scope='row'><span class='swatch' "
            f"style='background:{g.colour}'></span>{html.escape(g.label)}</th><td>{g.seeds}</td>"
            f"<td class='num'>{rounds}</td>{cells}</tr>"
        )
    return (
        f"<table class='results' id='comparison'><thead><tr><th>configuration</th><th>runs</th><th>rounds</th>"
        f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def runs_table(groups: Sequence[Group]) -> str:
    """The page's table of every run as HTML: its name, configuration, seed, group, data module, clients, wall time and
    folder."""
    rows = []
    for g in groups:
        for run in g.runs:
            data = (run.config.get("data") or {}).get("class_path", "")
            clients = run.final("num_clients")
            rows.append(
                f"<tr><td>{html.escape(run.name)}</td><td>{html.escape(g.label)}</td><td>{run.seed}</td>"
                f"<td><code>{html.escape(g.key)}</code></td><td>{html.escape(data.rsplit('.', 1)[-1])}</td>"
                f"<td class='num'>{'' if clients is None else int(clients)}</td>"
                f"<td class='num'>{run.wall_time:.1f}</td>"
                f"<td><code>{html.escape(str(run.path))}</code></td></tr>"
            )
    return (
        "<table class='runs' id='runs'><thead><tr><th>run</th><th>configuration</th><th>seed</th><th>group</th>"
        "<th>data</th><th>clients</th><th>wall time (s)</th><th>folder</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


# -- figures -------------------------------------------------------------------------------------------------
@dataclass
class PageFigure:
    key: str
    title: str
    caption: str
    svg: str


def primary_metric(run: Run) -> str:
    """Accuracy when the run has it, else its first per-client metric."""
    return selection.primary_metric(selection.metric_names(run.metrics[-1], run.split))


def averaged_over(groups: Sequence[Group]) -> str:
    """What a configuration's mean and std are taken over: 'seeds', or 'runs' when some seed was repeated."""
    return "runs" if any(g.repeats for g in groups) else "seeds"


def figures(groups: Sequence[Group], split: str, metric: str) -> list[PageFigure]:
    """Every figure the runs have data for, in the page's order."""
    out: list[PageFigure] = []
    over = averaged_over(groups)
    seeds = f"mean over {over}, band ± std over {over}" if any(len(g.runs) > 1 for g in groups) else "one run each"
    label = "accuracy" if metric == "acc" else metric

    def add(key: str, title: str, caption: str, figure: Any) -> None:
        out.append(PageFigure(key, title, caption, plots.to_svg(figure, salt=key)))

    mean = [s for g in groups if (s := g.curve(f"{split}/{metric}_mean")) is not None]
    worst = [s for g in groups if (s := g.curve(f"{split}/{metric}_worst")) is not None]
    add(
        "accuracy",
        f"Client {label} over rounds",
        f"{split.capitalize()} {label} of every client's own model at each evaluated round: mean over clients (left) "
        f"and the worst client (right); {seeds}.",
        plots.line_figure([(f"Mean {label} over clients", label, mean), (f"Worst-client {label}", label, worst)]),
    )

    timed = [s for g in groups if (s := g.curve(f"{split}/{metric}_mean", VIRTUAL_TIME)) is not None]
    if timed:
        add(
            "accuracy-time",
            f"Client {label} over virtual time",
            f"{split.capitalize()} {label} of every client's own model, mean over clients, against the virtual time "
            f"the rounds took on the clients' devices (a `system:` section: {VIRTUAL_TIME}, its mean over "
            f"{over} at each evaluated round); {seeds}.",
            plots.line_figure([(f"Mean {label} over clients", label, timed)], xlabel="virtual time (s)"),
        )

    spread = []
    for g in groups:
        values = [
            row[metric]
            for run in g.runs
            if run.last_eval_round is not None
            for row in run.clients_at(run.last_eval_round)
            if np.isfinite(row.get(metric, np.nan))
        ]
        if values:
            spread.append((g.label, g.colour, np.array(values)))
    if spread:
        add(
            "spread",
            f"Per-client {label} at the end",
            f"{split.capitalize()} {label} of each client after the last round; a point is a client (of every run), "
            "the box spans the quartiles, the line is the median, the diamond the mean.",
            plots.spread_figure(spread, f"Per-client {label} after the last round", label),
        )

    ari = [s for g in groups if (s := g.curve("cluster/ari")) is not None]
    if ari:
        add(
            "ari",
            "Clustering quality over rounds",
            f"Adjusted Rand index of the clients' clusters against their true clusters, every round; {seeds}.",
            plots.line_figure([("ARI against the true clusters", "ARI", ari)], ylim=(-0.05, 1.05)),
        )

    timelines = [(g, t) for g in groups if (t := g.first.timeline()) is not None]
    if timelines:
        for g, t in timelines:
            t.title = f"{g.label}, seed {g.first.seed}"
        add(
            "timeline",
            "Cluster assignment over rounds",
            "Each client's cluster (row) at each evaluated round (column), and its true cluster beside it; clusters "
            "are numbered to match the true clusters they overlap most (Hungarian matching), so a client in its true "
            "cluster's colour is clustered correctly. One seed per configuration.",
            plots.timeline_figure([t for _, t in timelines]),
        )

    names = sorted({name for g in groups for name in g.first.matrices()})
    for name in names:
        panels, first = [], None
        for g in groups:
            files = g.first.matrices().get(name)
            if files:
                first = first if first is not None else np.load(files[0])
                round = int(files[-1].stem.rsplit("_round", 1)[1])
                panels.append((f"{g.label}, round {round}", np.load(files[-1]).astype(float)))
        assert first is not None  # `name` is a matrix of some configuration
        low, high = plots.matrix_range(name, first)
        add(
            f"matrix-{name}",
            f"Last {name.replace('_', ' ')} matrix",
            f"The last {name.replace('_', ' ')} matrix each configuration computed (seed shown: the lowest), clients "
            f"on both axes, on one fixed colour scale [{low:.3g}, {high:.3g}] for every run and round.",
            plots.heatmap_figure(panels, low, high, name.replace("_", " ")),
        )
    return out


# -- the page ------------------------------------------------------------------------------------------------
CSS = """
body { font-family: "DejaVu Serif", Georgia, serif; color: #222; margin: 0; background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 32px 48px; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: 3px; margin-top: 1.8em; }
p.lead { color: #555; margin-top: 0; }
table { border-collapse: collapse; font-size: 0.92em; margin: 0.6em 0; font-family: "DejaVu Sans", Arial, sans-serif; }
table.results { border-top: 2px solid #222; border-bottom: 2px solid #222; }
thead th { border-bottom: 1px solid #222; font-weight: 600; }
th, td { padding: 4px 10px; text-align: left; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody th { font-weight: normal; } table.runs { font-size: 0.8em; color: #333; } table.runs td { padding: 2px 8px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; border-radius: 2px; }
caption, figcaption, p.note { font-size: 0.9em; color: #444; text-align: left; caption-side: top; }
.figures { display: flex; flex-wrap: wrap; align-items: flex-start; column-gap: 40px; }
figure { display: table; margin: 1.2em 0; } figure svg { display: block; height: auto; }
figcaption { display: table-caption; caption-side: bottom; }
"""


def page(title: str, groups: Sequence[Group], split: str, metric: str, figs: Sequence[PageFigure]) -> str:
    """The whole report as one self-contained HTML page: the lead, Table 1 with its notes, the ranking, the figures
    `figs` and the table of runs."""
    runs, over = sum(len(g.runs) for g in groups), averaged_over(groups)
    repeats = (
        " Runs of one seed are repeats, counted as runs rather than seeds: the runs column says how many."
        if over == "runs"
        else ""
    )
    label = "accuracy" if metric == "acc" else metric
    unseen, fine_tuned, private = optional_columns(groups, split, metric)
    columns = table_columns(split, metric, unseen, fine_tuned, private)
    unseen_note = (
        f" Unseen: the clients held out of training, each given a model by the method at the end (mean and "
        f"worst {label}), and the ARI of every client's cluster with the held-out ones placed by the method."
        if unseen
        else ""
    )
    tuned_note = (
        f" Fine-tuned: each client's model after `federation.finetune_epochs` local epochs on its own data "
        f"(mean and worst {label})."
        if fine_tuned
        else ""
    ) + (" Epsilon: the privacy spent by the end of the run (client-level DP)." if private else "")
    own = selection.selected_prefix(split).replace("_", "-")
    selection_note = (
        f"val-selected: the mean and worst-client {label} at the evaluated round with the best mean "
        f"validation {label}, the number to compare by"
        + (
            f"; {own}: the best mean {split} {label} over the evaluated rounds, which chooses the model "
            f"on the {split} set itself (as PFLlib's tables do), shown only to compare with published "
            "tables that report it"
            if own != "val-selected"
            else ""
        )
    )
    figure_html = "".join(
        f"<figure id='fig-{html.escape(f.key)}'>{f.svg}<figcaption><strong>Figure {i}. {html.escape(f.title)}."
        f"</strong> {html.escape(f.caption)}</figcaption></figure>"
        for i, f in enumerate(figs, 1)
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{CSS}</style></head>
<body><main>
<h1>{html.escape(title)}</h1>
<p class="lead">{plural(runs, "run")} in {plural(len(groups), "configuration")}, evaluated on each client's own
{html.escape(split)} split. Runs whose configs differ only in seed are one configuration: numbers are mean ± the
half-width of the mean's 95 % Student-t interval over its {over} (each cell also holds the population std, data-std),
and the curves show their mean with a ± std band.{repeats}</p>
<h2>Comparison</h2>
<p class="note"><strong>Table 1.</strong> Final round: {label} of every client's own model (mean over clients, standard
deviation across clients, worst client); {selection_note}; adjusted Rand index of the clustering against the true
clusters and the number of clusters (clustered methods only), and training wall time.{unseen_note}{tuned_note}</p>
{comparison_table(groups, columns)}
<p class="note" id="ranking">{html.escape(ranking_text(groups, split, metric))}</p>
<h2>Figures</h2>
<div class="figures">{figure_html}</div>
<h2>Runs</h2>
{runs_table(groups)}
</main></body></html>
"""


def build(paths: Sequence[str | Path], title: str = "fedlight report") -> tuple[str, list[Group]]:
    """The page for the runs in `paths` (run folders or folders of them), and the configuration groups."""
    runs = [load_run(path) for path in find_runs(paths)]
    groups = group_runs(runs)
    by_split: dict[str, list[Run]] = {}
    for run in runs:
        by_split.setdefault(run.split, []).append(run)
    if len(by_split) > 1:
        where = {
            split: os.path.commonpath([os.path.abspath(r.path) for r in found]) for split, found in by_split.items()
        }
        found = "; ".join(
            f"{plural(len(found), 'run')} on {split} under {where[split]}" for split, found in sorted(by_split.items())
        )
        example = where[min(by_split, key=lambda split: split == "val")]  # tuning trials evaluate val
        raise ReportError(
            f"the runs evaluate different splits ({found}): numbers on different splits do not "
            f"compare, so report one split at a time, e.g. `fedlight report {example}`"
        )
    split, metric = runs[0].split, primary_metric(runs[0])
    return page(title, groups, split, metric, figures(groups, split, metric)), groups


def output_path(runs: Sequence[Path], output: str | Path | None = None, overwrite: bool = False) -> Path:
    """Where the report goes: `output`, else report.html in the deepest folder holding every run (next to the
    runs, not in whatever folder the command ran from). An existing file there is refused unless `overwrite`, so
    no file is replaced silently."""
    if output is None:
        output = Path(os.path.commonpath([os.path.abspath(run.parent) for run in runs])) / "report.html"
    output = Path(output)
    if output.exists() and not overwrite:
        raise ReportError(f"{output} exists already: pass --overwrite to replace it, or --output to write elsewhere")
    return output


def write(
    paths: Sequence[str | Path],
    output: str | Path | None = None,
    title: str = "fedlight report",
    overwrite: bool = True,
) -> tuple[Path, list[Group]]:
    """Write the report of `paths` to `output` (default: see `output_path`) and return where, with its
    configuration groups. `overwrite` is on for callers that own the file (the sweep rewrites its report); the
    CLI passes `--overwrite`, refusing an existing file before any work."""
    runs = find_runs(paths)
    output = output_path(runs, output, overwrite)
    text, groups = build(runs, title)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return output, groups
