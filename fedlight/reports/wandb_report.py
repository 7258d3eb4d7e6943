"""`fedlight report ... --wandb ENTITY/PROJECT`: the report's runs as a W&B Report (wandb-workspaces, the optional
`wandb-report` extra): accuracy and ARI over rounds grouped by configuration (mean ± std over seeds, W&B's own
grouping by the runs' `group`), the matrices' heatmaps and the last clients table. It needs W&B online; offline or
without the extra it says so in one line and the HTML report stands alone."""

from __future__ import annotations

import netrc
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedlight.reports.runs import Group

EXTRA = "pip install 'fedlight[wandb-report]'"


def wandb_mode(requested: str) -> str:
    """The mode W&B runs in: "auto" is online when an API key is set (WANDB_MODE, WANDB_API_KEY or a netrc login)
    and offline otherwise."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1]
        return "online" if netrc.netrc().authenticators(host) else "offline"
    except (FileNotFoundError, netrc.NetrcParseError):
        return "offline"


def report_blocks(wr: Any, entity: str, project: str, groups: Sequence["Group"], title: str) -> Any:
    """The W&B Report object (not saved): one panel grid over the runs of `groups`, grouped by W&B group."""
    run = groups[0].first
    split, keys = run.split, {k for g in groups for r in g.runs for row in r.metrics for k in row}
    names = ", ".join(repr(g.key) for g in groups)
    runset = wr.Runset(entity=entity, project=project, name="runs", filters=f"Group in [{names}]", groupby=["group"])
    grouped = {"groupby_aggfunc": "mean", "groupby_rangefunc": "stddev"}
    panels = [
        wr.LinePlot(title="Mean client accuracy", x="Step", y=[f"{split}/acc_mean"], **grouped),
        wr.LinePlot(title="Worst-client accuracy", x="Step", y=[f"{split}/acc_worst"], **grouped),
    ]
    if "cluster/ari" in keys:
        panels.append(wr.LinePlot(title="ARI against the true clusters", x="Step", y=["cluster/ari"], **grouped))
    matrices = sorted({name for g in groups for name in g.first.matrices()})
    if matrices:
        panels.append(wr.MediaBrowser(title="Similarity matrices", media_keys=[f"matrices/{m}" for m in matrices]))
    panels.append(wr.WeavePanelSummaryTable(table_name="clients/table"))
    text = (
        f"{sum(len(g.runs) for g in groups)} runs in {len(groups)} configurations (W&B groups), built by "
        "`fedlight report`; curves are means over seeds with a ± std band."
    )
    return wr.Report(
        entity=entity, project=project, title=title, blocks=[wr.P(text), wr.PanelGrid(runsets=[runset], panels=panels)]
    )


def build(target: str, groups: Sequence["Group"], title: str) -> str:
    """Save the W&B Report of `groups` under ENTITY/PROJECT `target`; one line saying where it is, or why not."""
    entity, _, project = target.partition("/")
    if not entity or not project or "/" in project:
        raise ValueError(f"--wandb {target!r}: give ENTITY/PROJECT, e.g. --wandb my-team/fedlight")
    if wandb_mode("auto") != "online":
        return (
            "W&B report skipped: W&B is offline here (set WANDB_API_KEY or run `wandb login`, sync the runs with "
            "`wandb sync`, then rerun with --wandb)"
        )
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError:
        return f"W&B report skipped: wandb-workspaces is not installed ({EXTRA})"
    saved = report_blocks(wr, entity, project, groups, title).save()
    return f"W&B report: {saved.url}"
