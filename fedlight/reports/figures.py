"""The report's figures: every figure the runs have data for (`figures`), drawn by `fedlight.reports.plots` and
inlined as SVG with its title and caption."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlight.reports import plots
from fedlight.reports.runs import VIRTUAL_TIME, Group


@dataclass
class PageFigure:
    key: str
    title: str
    caption: str
    svg: str


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
