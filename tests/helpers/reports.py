"""What the tests of a run's printed summary and of the HTML report read: a rich table as plain text, a summary, the
report's comparison table, and a run folder in miniature."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import yaml
from rich.console import Console


def rendered(table) -> str:
    console = Console(width=200, record=True, color_system=None, file=io.StringIO())
    console.print(table)
    return console.export_text()


SUMMARY = {
    "run": "r",
    "algorithm": "OCFL",
    "rounds": 1,
    "num_clients": 6,
    "wall_time_s": 2.0,
    "test/acc_mean": 0.5,
    "test/acc_std": 0.25,
    "test/acc_worst": 0.125,
    "cluster/count": 4.0,
    "cluster/ari": 1.0,
    "cluster/clustered_round": 1.0,
    "cluster/temperature": 3.0,
}


def table(page: str) -> dict[str, dict[str, tuple[float, float, int] | None]]:
    """The comparison table: row label -> column -> (mean, std, seeds) from the cells' data, None for '–'."""
    body = re.search(r"<table class='results' id='comparison'>(.*?)</table>", page, re.S).group(1)
    headers = re.findall(r"<th>(.*?)</th>", body.split("</thead>")[0])[3:]
    out = {}
    for label, cells in re.findall(
        r"<tr data-group='[^']*'><th scope='row'><span[^>]*></span>(.*?)</th>(.*?)</tr>", body, re.S
    ):
        values = re.findall(r"<td class='num'(?: data-mean='([^']*)' data-std='([^']*)' data-n='(\d+)'[^>]*)?>", cells)[
            1:
        ]
        out[label] = {h: (float(m), float(s), int(n)) if m else None for h, (m, s, n) in zip(headers, values)}
    return out


def fake_run(folder: Path, seed: int, acc: float, lr: float = 0.1, algorithm: str = "FedAvg") -> Path:
    """A run folder as `fedlight fit` leaves it, in miniature (no training): two evaluated rounds in metrics.csv,
    summary.json with the final mean accuracy, config.yaml whose learning rate sets the configuration."""
    folder.mkdir(parents=True)
    (folder / "metrics.csv").write_text(
        f"round,test/acc_mean,test/acc_std,test/acc_worst\n1,{acc / 2},0.1,{acc / 4}\n2,{acc},0.1,{acc / 2}\n"
    )
    (folder / "summary.json").write_text(
        json.dumps(
            {
                "run": folder.name,
                "algorithm": algorithm,
                "seed": seed,
                "rounds": 2,
                "test/acc_mean": acc,
                "wall_time_s": 1.0,
            }
        )
    )
    (folder / "config.yaml").write_text(
        yaml.safe_dump({"seed": seed, "algorithm": f"fedlight.x.{algorithm}", "optimizer": {"lr": lr}})
    )
    return folder
