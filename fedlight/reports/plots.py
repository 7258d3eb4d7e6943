"""Figures of federated runs, drawn with matplotlib's object-oriented API (no pyplot, so no display and no global
figure state): the report's plots and the heatmaps logged to W&B. Each builder takes plain arrays and returns a
`Figure`, so the same picture goes into the HTML report (`to_svg`) and into W&B (`wandb.Image(figure)`)."""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import matplotlib
import numpy as np
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator
from scipy.optimize import linear_sum_assignment

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

STYLE: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "image.interpolation": "nearest",
    "svg.fonttype": "none",
    "legend.frameon": False,
}
MATRIX_CMAP = "viridis"
NOISE_COLOUR = "#d9d9d9"  # a client no cluster holds (label -1)
# Known kinds of logged matrices (Algorithm.log_matrix) by the words of their name, and the range each kind can take:
# the colour scale of a matrix is fixed by its kind, so a colour means the same value in every round and run.
MATRIX_RANGES: tuple[tuple[frozenset[str], tuple[float, float]], ...] = (
    (frozenset({"cosine", "distance"}), (0.0, 2.0)),
    (frozenset({"cosine", "similarity"}), (-1.0, 1.0)),
    (frozenset({"js"}), (0.0, math.log(2))),
    (frozenset({"jensen"}), (0.0, math.log(2))),
    (frozenset({"similarity"}), (0.0, 1.0)),
)

F = TypeVar("F", bound=Callable[..., Figure])


@dataclass
class Series:
    """One line of a line plot: a run or the mean over a group's seeds, with the seeds' std as a band. The band
    stays within `low` and `high` when given (the seeds' extremes), so it never shows an ARI above 1 or an
    accuracy no seed reached."""

    label: str
    colour: str
    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray | None = None
    low: np.ndarray | None = None
    high: np.ndarray | None = None

    def band(self) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) edge of the std band, clipped to [low, high]."""
        assert self.std is not None
        lower, upper = self.mean - self.std, self.mean + self.std
        if self.low is not None:
            lower = np.maximum(lower, self.low)
        if self.high is not None:
            upper = np.minimum(upper, self.high)
        return lower, upper


@dataclass
class Timeline:
    """Which cluster each client was in at each evaluated round, and the clients' true clusters (when known)."""

    title: str
    rounds: np.ndarray  # (R,) evaluated rounds
    assigned: np.ndarray  # (clients, R) cluster labels, -1 for a client no cluster holds
    true: np.ndarray | None  # (clients,)


def styled(build: F) -> F:
    """Build the figure under the report's style (rcParams are read when artists are created)."""

    @functools.wraps(build)
    def wrapper(*args: Any, **kwargs: Any) -> Figure:
        with matplotlib.rc_context(STYLE):
            return build(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def palette(name: str) -> list[Any]:
    """The colours of one of matplotlib's listed (qualitative) colour maps."""
    cmap = matplotlib.colormaps[name]
    assert isinstance(cmap, ListedColormap), f"{name} is not a listed colour map"
    return list(cmap.colors)  # type: ignore[arg-type]  # hinted as any colour input; these maps hold a list


def colours(count: int) -> list[str]:
    """`count` distinct colours (tab10, then tab20's light shades): one per run group, the same in every figure."""
    base = palette("tab10") + palette("tab20")[1::2]
    return [matplotlib.colors.to_hex(base[i % len(base)]) for i in range(count)]


def cluster_colours(count: int) -> list[str]:
    """`count` colours for clusters, from other palettes than the runs' so a cluster never looks like a run."""
    base = [c for name in ("Set2", "Dark2", "Set3") for c in palette(name)]
    return [matplotlib.colors.to_hex(base[i % len(base)]) for i in range(count)]


def matrix_range(name: str, first: np.ndarray) -> tuple[float, float]:
    """The fixed colour range of matrices called `name`: the range of its kind when the name says the kind
    (cosine distance [0, 2], cosine similarity [-1, 1], Jensen-Shannon [0, ln 2], other similarities [0, 1]),
    otherwise the range of the first matrix of that name."""
    words = set(name.lower().replace("/", "_").split("_"))
    for kind, bounds in MATRIX_RANGES:
        if kind <= words:
            return bounds
    low, high = float(np.nanmin(first)), float(np.nanmax(first))
    return (low, high) if high > low else (low, low + 1.0)


def to_svg(figure: Figure, salt: str) -> str:
    """The figure as an inline <svg> element: text kept as text (searchable, and small), ids salted with `salt` so
    that several figures share one page without clashes, no date in its metadata."""
    buffer = io.StringIO()
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": salt}):
        figure.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


@styled
def line_figure(
    panels: Sequence[tuple[str, str, Sequence[Series]]], xlabel: str = "round", ylim: tuple[float, float] | None = None
) -> Figure:
    """Panels side by side, each (title, y label, series); one legend for all."""
    figure = Figure(figsize=(3.7 * len(panels) + 1.6, 3.0), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, ylabel, series) in zip(axes, panels):
        for s in series:
            ax.plot(
                s.x,
                s.mean,
                color=s.colour,
                label=s.label,
                linewidth=1.6,
                marker="o" if len(s.x) <= 25 else None,
                markersize=3,
            )
            if s.std is not None:
                ax.fill_between(s.x, *s.band(), color=s.colour, alpha=0.18, linewidth=0)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right upper")
    return figure


@styled
def spread_figure(groups: Sequence[tuple[str, str, np.ndarray]], title: str, ylabel: str) -> Figure:
    """A box per group (label, colour, values) with every value drawn as a point over it and the mean as a
    diamond: the spread of a metric across clients."""
    figure = Figure(figsize=(max(3.5, 1.1 * len(groups) + 1.5), 3.2), layout="constrained")
    ax = figure.subplots()
    positions = np.arange(1, len(groups) + 1)
    boxes = ax.boxplot(
        [values for _, _, values in groups],
        positions=positions,
        widths=0.55,
        showfliers=False,
        patch_artist=True,
        medianprops={"color": "black", "linewidth": 1.2},
    )
    jitter = np.random.default_rng(0)
    for position, box, (_, colour, values) in zip(positions, boxes["boxes"], groups):
        box.set(facecolor=colour, alpha=0.25, edgecolor=colour)
        ax.scatter(
            position + jitter.uniform(-0.16, 0.16, len(values)),
            values,
            s=11,
            color=colour,
            edgecolors="white",
            linewidths=0.3,
            zorder=3,
        )
        ax.scatter(
            [position],
            [np.mean(values)],
            marker="D",
            s=22,
            color="black",
            zorder=4,
            label="mean" if position == 1 else None,
        )
    ax.set_xticks(positions, [label for label, _, _ in groups], rotation=20 if len(groups) > 4 else 0)
    ax.set(title=title, ylabel=ylabel)
    ax.grid(axis="x", visible=False)
    ax.legend(loc="lower right")
    return figure


def cluster_codes(assigned: np.ndarray, true: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Assigned and true labels as colour indices, the assigned ones matched to the true ones (Hungarian
    matching over all clients and rounds), so a client drawn in its true cluster's colour is in the cluster that
    holds most of that true cluster. Unmatched clusters get the next colours; -1 stays -1."""
    held = assigned >= 0
    found = np.unique(assigned[held])
    if true is None:  # no truth: number the clusters in order of first appearance in the last round
        order = list(dict.fromkeys(assigned[:, -1][assigned[:, -1] >= 0].tolist())) + found.tolist()
        mapping = {label: code for code, label in enumerate(dict.fromkeys(order))}
        true_codes = None
    else:
        truths, true_codes = np.unique(true, return_inverse=True)
        table = np.zeros((len(found), len(truths)))
        rows = np.searchsorted(found, assigned[held])
        np.add.at(table, (rows, np.broadcast_to(true_codes[:, None], assigned.shape)[held]), 1)
        matched_rows, matched_cols = linear_sum_assignment(-table)
        mapping = {int(found[r]): int(c) for r, c in zip(matched_rows, matched_cols)}
        spare = iter(range(len(truths), len(truths) + len(found)))
        mapping.update({int(label): next(spare) for label in found if int(label) not in mapping})
    codes = np.full(assigned.shape, -1)
    codes[held] = [mapping[int(label)] for label in assigned[held]]
    return codes, true_codes


def _ticks(values: np.ndarray, most: int = 10) -> tuple[np.ndarray, list[str]]:
    """Positions and labels of at most `most` ticks over `values` (indices of an image's columns or rows)."""
    step = max(1, math.ceil(len(values) / most))
    positions = np.arange(0, len(values), step)
    return positions, [str(int(values[i])) for i in positions]


@styled
def timeline_figure(panels: Sequence[Timeline]) -> Figure:
    """One panel per run: clients (rows) x evaluated rounds (columns) coloured by assigned cluster, with the
    true clusters as a column beside it in the same colours."""
    clients = max(t.assigned.shape[0] for t in panels)
    coded = [cluster_codes(t.assigned, t.true) for t in panels]
    count = (
        max(max(int(c.max()) for c, _ in coded), max((int(t.max()) for _, t in coded if t is not None), default=0)) + 1
    )
    cmap = ListedColormap([NOISE_COLOUR, *cluster_colours(count)])
    norm = BoundaryNorm(np.arange(-1.5, count), cmap.N)
    width = sum(0.9 + 0.16 * max(len(t.rounds), 8) for t in panels) + 1.4
    figure = Figure(figsize=(max(5.0, width), min(8.0, max(2.8, 0.16 * clients + 1.3))), layout="constrained")
    subfigures = figure.subfigures(1, len(panels), width_ratios=[max(len(t.rounds), 8) + 6 for t in panels])
    subfigures = subfigures if isinstance(subfigures, np.ndarray) else np.array([subfigures])  # one panel
    for sub, timeline, (codes, true_codes) in zip(subfigures, panels, coded):
        ratios = [max(len(timeline.rounds), 2), 0.9] if true_codes is not None else [1]
        axes = sub.subplots(1, len(ratios), width_ratios=ratios, sharey=True, squeeze=False)[0]
        axes[0].imshow(codes, cmap=cmap, norm=norm, aspect="auto")
        axes[0].set_xticks(*_ticks(timeline.rounds))
        axes[0].set(xlabel="round", ylabel="client", title=timeline.title)
        axes[0].set_yticks(*_ticks(np.arange(codes.shape[0]), 20))
        if true_codes is not None:
            axes[1].imshow(true_codes[:, None], cmap=cmap, norm=norm, aspect="auto")
            axes[1].set_xticks([0], ["true"])
            axes[1].tick_params(axis="y", left=False)
        for ax in axes:
            ax.grid(False)
    used = sorted(
        {int(c) for codes, true_codes in coded for c in np.unique(codes)}
        | {int(c) for _, true_codes in coded if true_codes is not None for c in np.unique(true_codes)}
    )
    handles = [Patch(color=cmap(norm(c)), label="no cluster" if c < 0 else f"cluster {c}") for c in used]
    figure.legend(handles=handles, loc="outside right upper")
    return figure


@styled
def heatmap_figure(panels: Sequence[tuple[str, np.ndarray]], vmin: float, vmax: float, label: str) -> Figure:
    """Matrices side by side on one fixed colour scale [vmin, vmax] with one colour bar, axes in client index."""
    figure = Figure(figsize=(3.1 * len(panels) + 1.0, 3.1), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    image = None
    for ax, (title, matrix) in zip(axes, panels):
        image = ax.imshow(matrix, cmap=MATRIX_CMAP, vmin=vmin, vmax=vmax)
        ax.set(title=title, xlabel="client", ylabel="client")
        ax.set_xticks(*_ticks(np.arange(matrix.shape[1])))
        ax.set_yticks(*_ticks(np.arange(matrix.shape[0])))
        ax.grid(False)
    assert image is not None, "no panel to draw"
    figure.colorbar(image, ax=list(axes), label=label, shrink=0.9)
    return figure
