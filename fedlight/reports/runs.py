"""Run folders read back: where they are (`find_runs`), what one holds (`Run`: metrics.csv, clients.csv,
summary.json, config.yaml, matrices/) and which runs are one configuration (`Group`, `group_runs`), for the report's
tables and figures and for benchmarks that read runs."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fedlight.reports import plots, selection
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


def primary_metric(run: Run) -> str:
    """Accuracy when the run has it, else its first per-client metric."""
    return selection.primary_metric(selection.metric_names(run.metrics[-1], run.split))


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
