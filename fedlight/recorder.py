"""Where a run's numbers go: metrics.csv (one row a round), clients.csv (one row a client and evaluated
round), summary.json, and Weights & Biases (offline when no API key is set)."""
from __future__ import annotations

import csv
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


@dataclass
class LoggerConfig:
    """Logging settings.

    Args:
        wandb: log to Weights & Biases.
        project: W&B project.
        entity: W&B entity (team or user); None uses the default.
        mode: "auto" is online when an API key is set (WANDB_API_KEY or a netrc login) and offline otherwise.
        tags: W&B tags.
        per_client_max: log each client's metrics as its own W&B series when there are at most this many
            clients (histograms and clients.csv always hold them).
    """

    wandb: bool = True
    project: str = "fedlight"
    entity: str | None = None
    mode: Literal["auto", "online", "offline"] = "auto"
    tags: list[str] = field(default_factory=list)
    per_client_max: int = 100


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


def heatmap(matrix: np.ndarray, scale: int = 8) -> np.ndarray:
    """A matrix as a grayscale uint8 image (min black, max white), each entry a scale x scale block."""
    low, high = np.nanmin(matrix), np.nanmax(matrix)
    unit = (matrix - low) / (high - low) if high > low else np.zeros_like(matrix)
    return np.kron(np.round(255 * unit).astype(np.uint8), np.ones((scale, scale), dtype=np.uint8))


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


class RunRecorder:
    """Writes a run's metrics to its folder and to W&B. `resume_round` keeps the rows up to that round."""

    def __init__(self, run_dir: Path, config: dict[str, Any], settings: LoggerConfig, run_name: str,
                 wandb_id: str | None = None, resume_round: int | None = None) -> None:
        self.run_dir = run_dir
        self.settings = settings
        self.metrics = CsvTable(run_dir / "metrics.csv", resume_round)
        self.clients = CsvTable(run_dir / "clients.csv", resume_round)
        self.wandb_run = None
        self.wandb_id = wandb_id
        if settings.wandb:
            self._start_wandb(config, run_name)

    def _start_wandb(self, config: dict[str, Any], run_name: str) -> None:
        import wandb

        mode = wandb_mode(self.settings.mode)
        self.wandb_id = self.wandb_id or secrets.token_hex(4)
        self.wandb_run = wandb.init(project=self.settings.project, entity=self.settings.entity, name=run_name,
                                    id=self.wandb_id, resume="allow", dir=str(self.run_dir), mode=mode,
                                    config=config, tags=self.settings.tags,
                                    settings=wandb.Settings(console="off", silent=True))

    def log_round(self, metrics: dict[str, Any]) -> None:
        """One round's scalars, and the per-client values under metrics['clients'] when it was evaluated."""
        round = metrics["round"]
        per_client: dict[str, np.ndarray] = metrics.get("clients", {})
        matrices: dict[str, np.ndarray] = metrics.get("matrices", {})
        scalars = {k: v for k, v in metrics.items() if isinstance(v, numbers.Real)}
        self._save_matrices(round, matrices)
        self.metrics.append([scalars])
        if per_client:
            n = len(next(iter(per_client.values())))
            self.clients.append([{"round": round, "client": c, **{k: float(v[c]) for k, v in per_client.items()}}
                                 for c in range(n)])
        if self.wandb_run is not None:
            self.wandb_run.log(self._wandb_payload(scalars, per_client, matrices), step=round)

    def _save_matrices(self, round: int, matrices: dict[str, np.ndarray]) -> None:
        """matrices/<name>_round<NNNN>.npy for each matrix an algorithm reported."""
        if matrices:
            folder = self.run_dir / "matrices"
            folder.mkdir(exist_ok=True)
            for name, matrix in matrices.items():
                np.save(folder / f"{name.replace('/', '_')}_round{round:04d}.npy", np.asarray(matrix))

    def _wandb_payload(self, scalars: dict[str, Any], per_client: dict[str, np.ndarray],
                       matrices: dict[str, np.ndarray]) -> dict[str, Any]:
        import wandb

        payload = {k: v for k, v in scalars.items() if k != "round" and isinstance(v, (int, float))}
        for name, matrix in matrices.items():
            payload[f"matrices/{name}"] = wandb.Image(heatmap(np.asarray(matrix, dtype=float)), caption=name)
        for name, values in per_client.items():
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
