"""The run's files, written by the `CsvRecorder` callback: config.yaml (the resolved config), metrics.csv (one row a
round), clients.csv (one row a client and evaluated round), matrices/*.npy and summary.json. Only the first process
of a run writes them."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlight.run.callbacks import Callback, Run

if TYPE_CHECKING:
    from fedlight.engine.round_result import RoundResult

# Per-client columns that describe a client rather than measure it: the clusters lead a row, the training-set size
# ends it, and the constant ones go to the W&B table only (no per-client series, no histogram).
LEADING_COLUMNS = ("true_cluster", "cluster")
TRAILING_COLUMNS = ("samples",)
CONSTANT_COLUMNS = ("true_cluster", "samples")


class CsvTable:
    """A CSV file rewritten whole (atomically) on every append, so new columns can appear and a resumed run
    can drop the rows the crashed run wrote after its last checkpoint."""

    def __init__(self, path: Path, keep_until_round: int | None = None) -> None:
        self.path = path
        self.rows: list[dict[str, Any]] = []
        if keep_until_round is not None and path.is_file():
            with path.open(newline="") as f:
                self.rows = [r for r in csv.DictReader(f) if int(r["round"]) <= keep_until_round]

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Add `rows` and rewrite the file whole (through a temporary file, replaced atomically), its columns every key
        any row has, in order of appearance."""
        self.rows.extend(rows)
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.path)


def client_rows(
    round: int, per_client: dict[str, np.ndarray], newcomers: dict[str, np.ndarray] | None = None
) -> list[dict[str, Any]]:
    """One row per client: round, client, its clusters, its metrics, its training-set size, then what its local
    training reported this round (`train/...`, empty for a client that did not train); ints stay ints. With held-out
    clients (`newcomers`), their rows follow, numbered after the training clients, and every row ends with
    `held_out` (False for a training client)."""
    rows = _rows(round, per_client)
    if not newcomers:
        return rows
    first = len(rows)
    return [{**r, "held_out": False} for r in rows] + [
        {**r, "client": first + r["client"], "held_out": True} for r in _rows(round, newcomers)
    ]


def _rows(round: int, per_client: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    if not per_client:
        return []
    edges = LEADING_COLUMNS + TRAILING_COLUMNS
    training = [k for k in per_client if k.startswith("train/")]
    names = (
        [k for k in LEADING_COLUMNS if k in per_client]
        + [k for k in per_client if k not in edges and k not in training]
        + [k for k in TRAILING_COLUMNS if k in per_client]
        + training
    )
    count = len(per_client[names[0]])
    return [{"round": round, "client": c, **{k: per_client[k][c].item() for k in names}} for c in range(count)]


def matrix_file(folder: Path, name: str, round: int) -> Path:
    """matrices/<name>_roundNNNN.npy (a '/' in the name becomes '_')."""
    return folder / "matrices" / f"{name.replace('/', '_')}_round{round:04d}.npy"


class CsvRecorder(Callback):
    """Writes a run's numbers into its folder; a resumed run keeps the rows up to its checkpoint's round."""

    def on_fit_start(self, run: Run) -> None:
        keep = run.federation.round if run.resumed else None
        self.run_dir = run.run_dir
        config = run.run_dir / "config.yaml"
        if not config.is_file() or config.read_text() != run.config_text:  # a resumed run may have more rounds
            config.with_name("config.yaml.tmp").write_text(run.config_text)
            os.replace(config.with_name("config.yaml.tmp"), config)
        self.metrics = CsvTable(run.run_dir / "metrics.csv", keep)
        self.clients = CsvTable(run.run_dir / "clients.csv", keep)

    def on_round_end(self, run: Run, result: "RoundResult") -> None:
        for name, matrix in result.matrices.items():
            path = matrix_file(self.run_dir, name, result.round)
            path.parent.mkdir(exist_ok=True)
            np.save(path, np.asarray(matrix))
        self.metrics.append([result.scalars])
        rows = client_rows(result.round, result.per_client, result.newcomers)
        if rows:
            self.clients.append(rows)

    def on_fit_end(self, run: Run, summary: dict[str, Any]) -> None:
        """summary.json as strict JSON (a non-finite number becomes null)."""
        (self.run_dir / "summary.json").write_text(json.dumps(strict_json(summary), indent=2, allow_nan=False))


def strict_json(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with every non-finite float replaced by None, in nested dicts too (the plan's probe result)."""
    return {k: _finite(v) for k, v in summary.items()}


def _finite(value: Any) -> Any:
    """`value` with non-finite floats as None, dicts and lists walked."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
