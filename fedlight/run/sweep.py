"""`fedlight sweep --config sweep.yaml`: every algorithm x grid point x seed of one base run config, then the report
of them all.

The runs go one after another in this process: each `fit` seeds torch first and every random choice depends only
on (seed, round, client), so a run gives the same numbers as it would alone, without paying the start-up of torch
and Lightning once per run. A combination whose folder already has summary.json is skipped and an unfinished one
is resumed (`fit --resume`, with the run's own config), so rerunning an interrupted sweep finishes it.

    base: ../quickstart.yaml            # a run config, relative to this file
    output_dir: runs/sweep              # one folder per run: <name>-s<seed>; the report lands here too
    algorithms:                         # short names, class paths, or {class_path, init_args, name, overrides}
      - fedavg
      - {class_path: fedprox, init_args: {mu: 0.01}}
      - {class_path: fedavg, name: fedavg-ft, overrides: {federation.finetune_epochs: 1}}
    seeds: [0, 1, 2]
    grid:                               # any dotted `fit` key -> its values: every combination runs
      model.init_args.lr: [0.01, 0.05]
      federation.local_epochs: [1, 2]
    overrides: {federation.rounds: 10}  # any `fit` option, for every run

Without `algorithms`, every run keeps the base config's algorithm. A grid point's run folder is named after its
values: `fedprox-lr0.01-local_epochs2-s0`.
"""

from __future__ import annotations

import importlib
import itertools
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from fedlight.engine.threads import sharing_environment
from fedlight.reports import report
from fedlight.reports.tables import console_table
from fedlight.run import registry
from fedlight.run.termination import INTERRUPTED_EXIT, TERMINATED_EXIT
from fedlight.plugin.algorithm import Algorithm


class SweepError(ValueError):
    """A sweep file the sweep cannot run; the message names the problem and the fix."""


class SweepInterrupted(Exception):
    """Ctrl-C or SIGTERM during one of the sweep's runs; the message says how to continue, `exit_code` is the
    run's (130 or 143)."""

    def __init__(self, message: str, exit_code: int = INTERRUPTED_EXIT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class SweepConfig:
    """A grid of runs.

    Args:
        base: the run config every run starts from (relative paths are relative to the sweep file).
        algorithms: short names (`fedlight list`), class paths, or mappings with `class_path`, optional
            `init_args`, an optional `name` (the run folders' prefix; needed when one algorithm appears twice) and
            optional `overrides` for that entry's runs only (FedAvg-FT: fedavg with federation.finetune_epochs).
            Empty: the base config's own algorithm (then give a `grid`).
        seeds: the seeds every algorithm runs with.
        grid: dotted `fit` keys, each with a list of values; every combination of them runs with every algorithm
            and seed (an entry's own `overrides` win over the grid).
        output_dir: the folder of the run folders and the report.
        overrides: `fit` options for every run, as dotted keys (`federation.rounds: 5`).
        report: the report's file name inside output_dir.
        title: the report's title.
    """

    base: str
    algorithms: list[str | dict[str, Any]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=lambda: [0])
    grid: dict[str, list[Any]] = field(default_factory=dict)
    output_dir: str = "runs/sweep"
    overrides: dict[str, Any] = field(default_factory=dict)
    report: str = "report.html"
    title: str = "fedlight sweep"


@dataclass
class Combination:
    name: str  # run folder name
    algorithm: str | None  # the --algorithm value: a class path, or a JSON object with init_args (None: the base's)
    seed: int
    overrides: dict[str, Any] = field(default_factory=dict)  # the entry's own fit options


def load(path: str | Path) -> tuple[SweepConfig, Path]:
    """The sweep file, checked key by key; returns it with its base config resolved to a path."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"{path}: no such sweep file")
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise SweepError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from error
    if not isinstance(document, dict):
        raise SweepError(f"{path}: a sweep file is a mapping with base, algorithms and seeds")
    known = [f.name for f in fields(SweepConfig)]
    unknown = [k for k in document if k not in known]
    if unknown:
        raise SweepError(f"{path}: unknown key {unknown[0]!r}; a sweep file has {', '.join(known)}")
    if "base" not in document or not (document.get("algorithms") or document.get("grid")):
        raise SweepError(
            f"{path}: give the run config to start from (base) and a list of algorithms, a grid of "
            "values (grid: {model.init_args.lr: [0.01, 0.1]}), or both"
        )
    config = SweepConfig(**document)
    if not config.seeds:
        raise SweepError(f"{path}: empty seeds; list at least one")
    if not isinstance(config.grid, dict) or not all(isinstance(v, list) and v for v in config.grid.values()):
        raise SweepError(
            f"{path}: grid maps dotted fit keys to non-empty lists of values, e.g. grid: "
            "{model.init_args.lr: [0.01, 0.1]}"
        )
    base = path.parent / config.base
    if not base.is_file():
        raise SweepError(
            f"{path}: base config {config.base} not found (looked for {base}); base is relative to the sweep file"
        )
    return config, base


def _class_path(value: str, source: Path) -> str:
    """An algorithm's short name or class path as a class path, refusing what is not an Algorithm."""
    try:
        path = registry.algorithm_path(value)
    except ValueError as error:
        raise SweepError(f"{source}: {error}") from None
    module, _, cls = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), cls) if module else None
    except ImportError:
        found = None
    if not (isinstance(found, type) and issubclass(found, Algorithm)):
        raise SweepError(
            f"{source}: {value!r} is not an importable Algorithm class; give a short name from "
            "`fedlight list` or the class path of an Algorithm subclass (mypackage.MyAlgorithm)"
        )
    return path


def grid_points(grid: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Every combination of the grid's values, with its part of the run folder name: each key's last part (the
    whole key where two keys share it) followed by the value, e.g. 'lr0.01-local_epochs2'."""
    tails = [key.rsplit(".", 1)[-1] for key in grid]
    labels = [tail if tails.count(tail) == 1 else key for key, tail in zip(grid, tails)]
    points = []
    for values in itertools.product(*grid.values()):
        name = "-".join(f"{label}{value}".replace("/", "_") for label, value in zip(labels, values))
        points.append((name, dict(zip(grid, values))))
    return points


def combinations(config: SweepConfig, source: Path) -> list[Combination]:
    """Every (algorithm, grid point, seed) of the sweep, all algorithms checked before anything runs."""
    entries: list[tuple[str, str | None, dict[str, Any]]] = [] if config.algorithms else [("", None, {})]
    for entry in config.algorithms:
        spec: dict[str, Any] = {"class_path": entry} if isinstance(entry, str) else dict(entry)
        if "class_path" not in spec:
            raise SweepError(
                f"{source}: algorithm entry {entry!r} has no class_path; write a short name, or a "
                "mapping with class_path and init_args"
            )
        extra = set(spec) - {"class_path", "init_args", "name", "overrides"}
        if extra:
            raise SweepError(
                f"{source}: algorithm entry {entry!r} has unknown key {sorted(extra)[0]!r}; use "
                "class_path, init_args, name and overrides"
            )
        path = _class_path(spec["class_path"], source)
        name = spec.get("name") or spec["class_path"].rsplit(".", 1)[-1].lower()
        value = json.dumps({"class_path": path, "init_args": spec["init_args"]}) if spec.get("init_args") else path
        entries.append((name, value, dict(spec.get("overrides") or {})))
    names = [name for name, *_ in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SweepError(f"{source}: algorithm {twice[0]!r} appears twice; give each entry its own `name`")
    points = grid_points(config.grid) or [("", {})]
    return [
        Combination(
            "-".join(part for part in (name, label, f"s{seed}") if part), value, int(seed), {**point, **overrides}
        )
        for name, value, overrides in entries
        for label, point in points
        for seed in config.seeds
    ]


def fit_args(combination: Combination, base: Path, config: SweepConfig) -> list[str]:
    """The `fedlight fit` command line of one combination; an unfinished run (its folder exists) is resumed with
    its own config."""
    folder = Path(config.output_dir) / combination.name
    if (folder / "config.yaml").is_file():
        return ["fit", "--resume", str(folder)]
    chosen = ["--algorithm", combination.algorithm] if combination.algorithm else []
    args = [
        "fit",
        "--config",
        str(base),
        *chosen,
        "--seed",
        str(combination.seed),
        "--output_dir",
        config.output_dir,
        "--run_name",
        combination.name,
    ]
    for key, value in {**config.overrides, **combination.overrides}.items():
        args += [f"--{key}", value if isinstance(value, str) else json.dumps(value)]
    return args


def run(
    path: str | Path,
    fit: Callable[[list[str]], int],
    console: Console | None = None,
    jobs: int = 1,
    part: tuple[int, int] | None = None,
) -> Path | None:
    """Run the sweep in `path` with `fit` (the CLI's `main`) and write its report; returns the report's path.
    `jobs` > 1: the runs go `jobs` at once, each share in a process of its own (`run_parts`). `part` (i, n): only the
    runs i, i + n, i + 2n, ... in this process, and no report (what each of those processes does)."""
    console = console or Console()
    config, base = load(path)
    grid = combinations(config, Path(path))
    numbered = list(enumerate(grid, 1))
    if part is not None:
        _run_each(numbered[part[0] :: part[1]], len(grid), config, base, path, fit, console)
        return None
    if jobs > 1 and len(grid) > 1:
        run_parts(path, min(jobs, len(grid)))
    else:
        _run_each(numbered, len(grid), config, base, path, fit, console)
    output = Path(config.output_dir) / config.report
    _, groups = report.write([Path(config.output_dir) / c.name for c in grid], output, config.title)
    console.print(console_table(groups))
    console.print(f"report: {output}")
    return output


def _run_each(
    numbered: list[tuple[int, Combination]],
    total: int,
    config: SweepConfig,
    base: Path,
    path: str | Path,
    fit: Callable[[list[str]], int],
    console: Console,
) -> None:
    """The numbered combinations one after another in this process: finished ones skipped, the others run."""
    for i, combination in numbered:
        folder = Path(config.output_dir) / combination.name
        if (folder / "summary.json").is_file():
            console.print(f"sweep {i}/{total}: {combination.name} done already, skipped")
            continue
        console.print(f"[bold]sweep {i}/{total}: {combination.name}[/bold]")
        code = fit(fit_args(combination, base, config))
        if code in (INTERRUPTED_EXIT, TERMINATED_EXIT):
            raise SweepInterrupted(
                f"sweep interrupted in run {combination.name}; rerun `fedlight sweep --config "
                f"{path}` to continue: finished runs are skipped, unfinished ones resumed",
                code,
            )
        if code:
            raise SweepError(
                f"run {combination.name} failed (exit code {code}, its error is above); fix it and rerun "
                "the sweep: finished runs are skipped"
            )


def parse_part(text: str) -> tuple[int, int]:
    """'I/N' (0 <= I < N) as (I, N)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SweepError(f"--part {text!r}: give I/N, the I-th of N shares (0 <= I < N)") from None
    if not 0 <= i < n:
        raise SweepError(f"--part {text!r}: I must be 0 to N-1")
    return i, n


def run_parts(path: str | Path, jobs: int) -> None:
    """`jobs` processes (`fedlight sweep --part i/jobs`), each running its share of the runs one after another, all
    told that `jobs` runs share the machine (`FEDLIGHT_PARALLEL_RUNS`), so each takes its share of the cores
    instead of all of them. Ctrl-C reaches them all (one process group); each keeps its runs resumable."""
    env = sharing_environment(jobs)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "fedlight", "sweep", "--config", str(path), "--part", f"{i}/{jobs}"], env=env
        )
        for i in range(jobs)
    ]
    try:
        codes = [process.wait() for process in processes]
    except KeyboardInterrupt:
        codes = [process.wait() for process in processes]
        codes.append(INTERRUPTED_EXIT)
    stopped = next((code for code in codes if code in (INTERRUPTED_EXIT, TERMINATED_EXIT)), None)
    if stopped is not None:
        raise SweepInterrupted(
            f"sweep interrupted; rerun `fedlight sweep --config {path} --jobs {jobs}` to continue: "
            "finished runs are skipped, unfinished ones resumed",
            stopped,
        )
    failed = [i for i, code in enumerate(codes) if code]
    if failed:
        raise SweepError(
            f"{len(failed)} of the sweep's {jobs} processes failed (their errors are above); fix it and "
            "rerun the sweep: finished runs are skipped"
        )
