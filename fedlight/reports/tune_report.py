"""The report of a tuning study (`fedlight tune`): the search history (the objective of every trial, the best so
far, and each parameter's importance as Optuna computes it) and, when the best configuration ran on final seeds,
the tuned against the default settings on the test split, in the same tables and figures as `fedlight report`.

It takes plain records, not Optuna objects, so reports stay free of the tuning library."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from fedlight.reports import plots, report
from fedlight.reports.figures import figures
from fedlight.reports.runs import group_runs, load_run, plural, primary_metric

STATE_MARKERS = {"complete": ("o", "#1f77b4"), "pruned": ("x", "#7f7f7f"), "fail": ("v", "#d62728")}


@dataclass
class TrialRecord:
    """One trial with an outcome: its state, objective (for a pruned trial, the last value reported), parameters,
    run folder and the last round it reported."""

    number: int
    state: str
    value: float | None
    params: dict[str, Any]
    run_dir: str | None = None
    last_round: int | None = None


def best_so_far(records: Sequence[TrialRecord], maximize: bool) -> tuple[np.ndarray, np.ndarray]:
    """(trial numbers, best objective of the completed trials up to each) over the completed trials."""
    done = sorted(
        (r.number, r.value) for r in records if r.state == "complete" and r.value is not None and math.isfinite(r.value)
    )
    numbers = np.array([n for n, _ in done])
    values = np.array([v for _, v in done], dtype=float)
    best = np.maximum.accumulate(values) if maximize else np.minimum.accumulate(values)
    return numbers, best


@plots.styled
def history_figure(records: Sequence[TrialRecord], metric: str, maximize: bool) -> Figure:
    """The objective of every trial by trial number (pruned: the last value reported), and the best so far."""
    figure = Figure(figsize=(6.0, 3.0), layout="constrained")
    ax = figure.subplots()
    for state, (marker, colour) in STATE_MARKERS.items():
        points = [
            (r.number, r.value) for r in records if r.state == state and r.value is not None and math.isfinite(r.value)
        ]
        if points:
            trials, values = zip(*points)
            ax.scatter(trials, values, marker=marker, color=colour, label=state, s=22, zorder=3)
    numbers, best = best_so_far(records, maximize)
    if len(numbers):
        ax.step(numbers, best, where="post", color="#ff7f0e", label="best so far", linewidth=1.4)
    ax.set(title="Objective by trial", xlabel="trial", ylabel=metric)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="best")
    return figure


@plots.styled
def importance_figure(importances: dict[str, float]) -> Figure:
    """One horizontal bar per parameter: its share of the objective's variance (fANOVA), largest on top."""
    names = sorted(importances, key=lambda name: importances[name])
    figure = Figure(figsize=(6.0, 0.5 + 0.35 * len(names)), layout="constrained")
    ax = figure.subplots()
    ax.barh(names, [importances[n] for n in names], color="#1f77b4")
    ax.set(title="Parameter importance", xlabel="importance (fANOVA, sums to 1)", xlim=(0, 1))
    return figure


def trials_table(records: Sequence[TrialRecord]) -> str:
    """The table of trials as HTML, in trial order: each one's state, objective, last round, the value of every
    parameter searched and its run folder."""
    keys = list(dict.fromkeys(k for r in records for k in r.params))
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    rows = []
    for r in sorted(records, key=lambda r: r.number):
        value = "–" if r.value is None or not math.isfinite(r.value) else f"{r.value:.4f}"
        cells = "".join(
            f"<td class='num'>{html.escape(_short(r.params[k])) if k in r.params else ''}</td>" for k in keys
        )
        rows.append(
            f"<tr data-state='{r.state}'><td class='num'>{r.number}</td><td>{r.state}</td>"
            f"<td class='num'>{value}</td><td class='num'>{r.last_round or ''}</td>{cells}"
            f"<td><code>{html.escape(r.run_dir or '')}</code></td></tr>"
        )
    return (
        f"<table class='runs' id='trials'><thead><tr><th>trial</th><th>state</th><th>objective</th>"
        f"<th>last round</th>{head}<th>folder</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value).rsplit(".", 1)[-1]


def search_section(records: Sequence[TrialRecord], importances: dict[str, float], metric: str, direction: str) -> str:
    """The search history as HTML: two figures and the table of trials."""
    maximize = direction == "maximize"
    drawn = [
        (
            "history",
            "Search history",
            f"{metric} of every trial (the mean over its last evaluated rounds; a "
            f"pruned trial shows the last value it reported) and the best completed trial so far "
            f"({direction}).",
            history_figure(records, metric, maximize),
        )
    ]
    if importances:
        drawn.append(
            (
                "importance",
                "Parameter importance",
                "How much of the objective's variance over the completed "
                "trials each parameter explains (Optuna's fANOVA evaluator).",
                importance_figure(importances),
            )
        )
    body = "".join(
        f"<figure id='fig-{key}'>{plots.to_svg(fig, salt=key)}<figcaption><strong>{html.escape(title)}."
        f"</strong> {html.escape(caption)}</figcaption></figure>"
        for key, title, caption, fig in drawn
    )
    note = "" if importances else "<p class='note'>Parameter importance needs two completed trials that differ.</p>"
    return (
        f"<h2>Search</h2><p class='note'>{plural(len(records), 'trial')} on the validation split, "
        f"objective {html.escape(metric)} ({direction}).</p><div class='figures'>{body}</div>{note}"
        f"{trials_table(records)}"
    )


def final_page(title: str, folders: Sequence[Path], search: str) -> str:
    """`fedlight report`'s page of the final runs, configurations labelled tuned and default, with the search
    section after the comparison table."""
    runs = [load_run(path) for path in folders]
    groups = group_runs(runs)
    for group in groups:
        group.label = f"{'tuned' if group.first.path.name.startswith('best-') else 'default'}: {group.label}"
    split, metric = runs[0].split, primary_metric(runs[0])
    text = report.page(title, groups, split, metric, figures(groups, split, metric))
    return text.replace("<h2>Figures</h2>", f"{search}<h2>Figures</h2>", 1)


def write(
    output: Path,
    title: str,
    records: Sequence[TrialRecord],
    importances: dict[str, float],
    metric: str,
    direction: str,
    final_folders: Sequence[Path] = (),
) -> Path:
    """Write the study's report to `output` (replacing an older one: the study owns it) and return its path."""
    search = search_section(records, importances, metric, direction)
    if final_folders:
        text = final_page(title, final_folders, search)
    else:
        text = (
            f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{report.CSS}</style></head>\n<body><main>\n<h1>{html.escape(title)}</h1>\n{search}\n"
            "</main></body></html>\n"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    return output
