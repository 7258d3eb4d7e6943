"""Table 1 of the report: its columns (`table_columns`), the cells as mean ± the 95 % interval over a
configuration's runs, the ranking under it with the gaps the seeds resolve, and the table of every run; as HTML for
the page and as a rich Table for the console."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlight.plugin.evaluation import UNSEEN, higher_is_better
from fedlight.reports import selection
from fedlight.reports.intervals import client_bootstrap, mean_interval, paired_difference
from fedlight.reports.runs import Group, Run, plural, primary_metric


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
    settled = resolution([g for _, g, v in ranked if v is not None], column, metric)
    return f"Ranked by {column.header} ({why}): {places}.{settled}"


def resolution(ranked: Sequence[Group], column: Column, metric: str = "acc") -> str:
    """' Resolved by the seeds: A over B. Not resolved by the seeds: B and C.' for each pair of neighbours in `ranked`:
    over the seeds when they share two or more (the 95 % interval of their paired difference over those seeds excludes
    0, `fedlight.reports.intervals.paired_difference`), else over the clients of the one seed they share (the bootstrap
    interval of the clients' paired differences at each run's compared round, read from clients.csv,
    `client_differences`); '' when no pair shares a seed."""
    verdicts: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {"seeds": ([], []), "clients": ([], [])}
    for upper, lower in zip(ranked, ranked[1:]):
        mine, theirs = values_by_seed(upper, column.value), values_by_seed(lower, column.value)
        pair = (upper.label, lower.label)
        if len(set(mine) & set(theirs)) >= 2:
            interval, by = paired_difference(mine, theirs), "seeds"
        else:
            differences = client_differences(upper, lower, column, metric)
            if differences is None:
                continue
            interval, by = client_bootstrap(differences), "clients"
        resolved, unresolved = verdicts[by]
        (resolved if interval.excludes_zero() else unresolved).append(pair)
    text = ""
    for by, how in (("seeds", "paired 95 % interval"), ("clients", "one seed: paired bootstrap over its clients")):
        resolved, unresolved = verdicts[by]
        if resolved:
            text += f" Resolved by the {by} ({how}): " + ", ".join(f"{a} over {b}" for a, b in resolved) + "."
        if unresolved:
            text += f" Not resolved by the {by}: " + ", ".join(f"{a} and {b}" for a, b in unresolved) + "."
    return text


def compared_round(run: Run, column: Column) -> int | None:
    """The round `column`'s value of `run` comes from: its validation-selected round for a selected column, else
    its last evaluated round."""
    if column.header.startswith(selection.VAL_SELECTED.replace("_", "-")):
        found = run.selected.get(f"{selection.VAL_SELECTED}/round")
        return int(found) if found is not None else None
    return run.last_eval_round


def client_differences(upper: Group, lower: Group, column: Column, metric: str) -> list[float] | None:
    """Each client's `metric` in `upper`'s run minus in `lower`'s, both of the one seed they share (or their only
    runs, when neither has a seed), at each run's compared round (`compared_round`); None when there is no such
    pair of runs or no client with the metric in both."""
    shared = sorted({r.seed for r in upper.runs} & {r.seed for r in lower.runs}, key=lambda s: (s is None, s))
    if not shared:
        return None
    a = next(r for r in upper.runs if r.seed == shared[0])
    b = next(r for r in lower.runs if r.seed == shared[0])
    round_a, round_b = compared_round(a, column), compared_round(b, column)
    if round_a is None or round_b is None:
        return None
    mine = {int(r["client"]): r[metric] for r in a.clients_at(round_a) if metric in r}
    theirs = {int(r["client"]): r[metric] for r in b.clients_at(round_b) if metric in r}
    clients = sorted(set(mine) & set(theirs))
    values = [mine[c] - theirs[c] for c in clients if np.isfinite(mine[c]) and np.isfinite(theirs[c])]
    return values or None


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
