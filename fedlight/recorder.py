"""Where a run's numbers go: metrics.csv (one row a round), clients.csv (one row a client and evaluated
round), matrices/*.npy, summary.json, and Weights & Biases (offline when no API key is set): scalars, a table of
the clients per evaluated round, and the matrices as heatmaps on a fixed colour scale; runs are grouped by
config and tagged with their algorithm."""
from __future__ import annotations

import csv
import hashlib
import json
import math
import netrc
import numbers
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedlight import plots


@dataclass
class LoggerConfig:
    """Logging settings.

    Args:
        wandb: log to Weights & Biases.
        project: W&B project.
        entity: W&B entity (team or user); None uses the default.
        mode: "auto" is online when an API key is set (WANDB_API_KEY or a netrc login) and offline otherwise.
        tags: W&B tags (the algorithm's class name is always added).
        group: W&B group; None groups the runs whose configs differ only in seed and paths (`config_group`).
        per_client_max: log each client's metrics as its own W&B series when there are at most this many
            clients (histograms and clients.csv always hold them).
    """

    wandb: bool = True
    project: str = "fedlight"
    entity: str | None = None
    mode: Literal["auto", "online", "offline"] = "auto"
    tags: list[str] = field(default_factory=list)
    group: str | None = None
    per_client_max: int = 100


# Config keys that only name, place or log a run: runs whose configs differ only in these are one configuration.
RUN_ONLY_KEYS = ("seed", "output_dir", "run_name", "resume", "checkpoint_every", "logger")
# Per-client columns that describe a client rather than measure it: the clusters lead a row, the training-set size
# ends it, and the constant ones go to the W&B table only (no per-client series, no histogram).
LEADING_COLUMNS = ("true_cluster", "cluster")
TRAILING_COLUMNS = ("samples",)
CONSTANT_COLUMNS = ("true_cluster", "samples")


def config_group(config: dict[str, Any], algorithm: str) -> str:
    """'<algorithm>-<8 hex digits>': the algorithm's class name and a hash of the resolved config without
    RUN_ONLY_KEYS, so that the seeds of one configuration share a W&B group and a row of the report."""
    same = {k: v for k, v in config.items() if k not in RUN_ONLY_KEYS}
    digest = hashlib.sha1(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{algorithm}-{digest}"


def wandb_mode(requested: str) -> str:
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
        self.rows.extend(rows)
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows)
        os.replace(tmp, self.path)


def client_rows(round: int, per_client: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """One row per client: round, client, its clusters, its metrics, its training-set size, then what its local
    training reported this round (`train/...`, empty for a client that did not train); ints stay ints."""
    if not per_client:
        return []
    edges = LEADING_COLUMNS + TRAILING_COLUMNS
    training = [k for k in per_client if k.startswith("train/")]
    names = [k for k in LEADING_COLUMNS if k in per_client] + \
        [k for k in per_client if k not in edges and k not in training] + \
        [k for k in TRAILING_COLUMNS if k in per_client] + training
    count = len(per_client[names[0]])
    return [{"round": round, "client": c, **{k: per_client[k][c].item() for k in names}} for c in range(count)]


class RunRecorder:
    """Writes a run's metrics to its folder and to W&B. `resume_round` keeps the rows up to that round."""

    def __init__(self, run_dir: Path, config: dict[str, Any], settings: LoggerConfig, run_name: str,
                 wandb_id: str | None = None, resume_round: int | None = None, algorithm: str = "Algorithm") -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.metrics = CsvTable(run_dir / "metrics.csv", resume_round)
        self.clients = CsvTable(run_dir / "clients.csv", resume_round)
        self.matrix_ranges: dict[str, tuple[float, float]] = {}
        self.wandb_run = None
        self.wandb_id = wandb_id
        if settings.wandb:
            self._start_wandb(config, run_name, algorithm)

    def _start_wandb(self, config: dict[str, Any], run_name: str, algorithm: str) -> None:
        import wandb

        mode = wandb_mode(self.settings.mode)
        self.wandb_id = self.wandb_id or secrets.token_hex(4)
        self.wandb_run = wandb.init(project=self.settings.project, entity=self.settings.entity, name=run_name,
                                    id=self.wandb_id, resume="allow", dir=str(self.run_dir), mode=mode,
                                    config=config, group=self.settings.group or config_group(config, algorithm),
                                    tags=list(dict.fromkeys([*self.settings.tags, algorithm])),
                                    settings=wandb.Settings(console="off", silent=True))

    def log_round(self, metrics: dict[str, Any]) -> None:
        """One round's scalars, and the per-client values under metrics['clients'] when it was evaluated."""
        round = metrics["round"]
        per_client: dict[str, np.ndarray] = metrics.get("clients", {})
        matrices: dict[str, np.ndarray] = metrics.get("matrices", {})
        scalars = {k: v for k, v in metrics.items() if isinstance(v, numbers.Real)}
        self._save_matrices(round, matrices)
        self.metrics.append([scalars])
        rows = client_rows(round, per_client)
        if rows:
            self.clients.append(rows)
        if self.wandb_run is not None:
            self.wandb_run.log(self._wandb_payload(round, scalars, per_client, rows, matrices), step=round)

    def _save_matrices(self, round: int, matrices: dict[str, np.ndarray]) -> None:
        """matrices/<name>_round<NNNN>.npy for each matrix an algorithm reported."""
        if matrices:
            folder = self.run_dir / "matrices"
            folder.mkdir(exist_ok=True)
            for name, matrix in matrices.items():
                np.save(folder / f"{name.replace('/', '_')}_round{round:04d}.npy", np.asarray(matrix))

    def matrix_range(self, name: str, matrix: np.ndarray) -> tuple[float, float]:
        """The colour range of matrices called `name`, fixed for the run: its kind's range, or the range of the
        first saved matrix of that name (which a resumed run finds on disk as well)."""
        if name not in self.matrix_ranges:
            saved = sorted((self.run_dir / "matrices").glob(f"{name.replace('/', '_')}_round*.npy"))
            self.matrix_ranges[name] = plots.matrix_range(name, np.load(saved[0]) if saved else matrix)
        return self.matrix_ranges[name]

    def _wandb_payload(self, round: int, scalars: dict[str, Any], per_client: dict[str, np.ndarray],
                       rows: list[dict[str, Any]], matrices: dict[str, np.ndarray]) -> dict[str, Any]:
        import wandb

        payload = {k: v for k, v in scalars.items() if k != "round" and isinstance(v, (int, float))}
        for name, matrix in matrices.items():
            matrix = np.asarray(matrix, dtype=float)
            figure = plots.heatmap_figure([(f"{name}, round {round}", matrix)], *self.matrix_range(name, matrix),
                                          label=name)
            payload[f"matrices/{name}"] = wandb.Image(figure, caption=f"{name}, round {round}")
        if rows:
            payload["clients/table"] = wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
        for name, values in per_client.items():
            if name in CONSTANT_COLUMNS:
                continue
            finite = values[np.isfinite(values)]
            if len(finite):
                payload[f"clients/{name}_hist"] = wandb.Histogram(finite)
            if len(values) <= self.settings.per_client_max:
                payload.update({f"clients/{name}/{c:03d}": float(v) for c, v in enumerate(values)})
        return payload

    @property
    def offline_dir(self) -> Path | None:
        """The folder of an offline W&B run (what `wandb sync` uploads), or None."""
        if self.wandb_run is None or not self.wandb_run.settings._offline:
            return None
        return Path(self.wandb_run.settings.sync_dir)

    def finish(self, summary: dict[str, Any]) -> None:
        """Write summary.json as strict JSON (a non-finite number becomes null) and close the W&B run."""
        clean = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.items()}
        (self.run_dir / "summary.json").write_text(json.dumps(clean, indent=2, allow_nan=False))
        if self.wandb_run is not None:
            self.wandb_run.summary.update({k: v for k, v in clean.items() if isinstance(v, (int, float, str))})
            self.wandb_run.finish()

    def close(self, interrupted: bool = False) -> None:
        """Close the W&B run without a summary (after Ctrl-C); a resumed run continues it."""
        if self.wandb_run is not None:
            self.wandb_run.finish(exit_code=1 if interrupted else 0)


class SilentRecorder:
    """What the other processes of a run spread over several use instead of a `RunRecorder`: the first process
    alone writes the run folder and logs to W&B."""

    wandb_id: str | None = None
    offline_dir: Path | None = None

    def log_round(self, metrics: dict[str, Any]) -> None:
        pass

    def finish(self, summary: dict[str, Any]) -> None:
        pass

    def close(self, interrupted: bool = False) -> None:
        pass
