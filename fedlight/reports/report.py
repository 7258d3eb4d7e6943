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

import html
import os
from collections.abc import Sequence
from pathlib import Path

from fedlight.reports import selection
from fedlight.reports.figures import PageFigure, averaged_over, figures
from fedlight.reports.runs import Group, ReportError, Run, find_runs, group_runs, load_run, plural, primary_metric
from fedlight.reports.tables import comparison_table, optional_columns, ranking_text, runs_table, table_columns


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
