"""The `WandbLogger` callback: a run's scalars, a table of the clients per evaluated round, and the matrices as heatmaps
on a fixed colour scale, logged to Weights & Biases (offline when no API key is set); runs are grouped by
configuration and tagged with their algorithm. A resumed run continues the same W&B run (its id is kept in the
checkpoint)."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from fedlight.reports.run_groups import config_group
from fedlight.reports.wandb_report import wandb_mode
from fedlight.run.callbacks import Callback, Run
from fedlight.run.recorder import CONSTANT_COLUMNS, client_rows, strict_json

if TYPE_CHECKING:  # jsonargparse runs this block to read LoggerConfig's annotations: nothing heavy in it (no wandb)
    from fedlight.engine.round_result import RoundResult


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


class WandbLogger(Callback):
    """Logs every round to W&B. `settings` are the config's `logger:` section."""

    def __init__(self, settings: LoggerConfig) -> None:
        self.settings = settings
        self.wandb_id: str | None = None
        self.wandb_run: Any = None  # a wandb Run once started (its type would import wandb where `list` must not)
        self.matrix_ranges: dict[str, tuple[float, float]] = {}
        self.run_dir = Path(".")

    def on_fit_start(self, run: Run) -> None:
        import wandb

        self.run_dir = run.run_dir
        algorithm = type(run.federation.algorithm).__name__
        self.wandb_id = self.wandb_id or secrets.token_hex(4)
        self.wandb_run = wandb.init(
            project=self.settings.project,
            entity=self.settings.entity,
            name=run.name,
            id=self.wandb_id,
            resume="allow",
            dir=str(run.run_dir),
            # WANDB_MODE may hold any mode wandb takes, not only those its hints name
            mode=wandb_mode(self.settings.mode),  # type: ignore[arg-type]
            config=run.config,
            group=self.settings.group or config_group(run.config, algorithm),
            tags=list(dict.fromkeys([*self.settings.tags, algorithm])),
            settings=wandb.Settings(console="off", silent=True),
        )

    def on_round_end(self, run: Run, result: "RoundResult") -> None:
        assert self.wandb_run is not None, "on_fit_start starts the W&B run"
        rows = client_rows(result.round, result.per_client, result.newcomers)
        self.wandb_run.log(
            self._payload(result.round, result.scalars, result.per_client, rows, result.matrices), step=result.round
        )

    def on_fit_end(self, run: Run, summary: dict[str, Any]) -> None:
        assert self.wandb_run is not None, "on_fit_start starts the W&B run"
        self.wandb_run.summary.update(
            {k: v for k, v in strict_json(summary).items() if isinstance(v, (int, float, str))}
        )
        offline = self.offline_dir
        self.wandb_run.finish()
        if offline is not None:
            folders = " ".join(str(f) for f in self.offline_folders(offline))
            run.console.print(f"upload to W&B: wandb sync {folders}", highlight=False)

    def on_interrupt(self, run: Run) -> None:
        """Close the W&B run without a summary; a resumed run continues it."""
        if self.wandb_run is not None:
            self.wandb_run.finish(exit_code=1)

    @property
    def offline_dir(self) -> Path | None:
        """The folder of an offline W&B run (what `wandb sync` uploads), or None."""
        if self.wandb_run is None or not self.wandb_run.settings._offline:
            return None
        return Path(self.wandb_run.settings.sync_dir)

    def offline_folders(self, newest: Path) -> list[Path]:
        """Every offline folder of this W&B run, oldest first: a resumed run writes a new one each time, all with
        the run's id (W&B adds "-1", "-2" to a folder name taken in the same second), and `wandb sync` must be given
        all of them to upload the whole run."""
        own = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(str(self.wandb_id))}(-\d+)?")
        return sorted(f for f in newest.parent.glob("offline-run-*") if own.fullmatch(f.name)) or [newest]

    def state_dict(self) -> dict[str, Any]:
        """The W&B run's id, so a resumed run continues the same W&B run."""
        return {"wandb_id": self.wandb_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the W&B run's id from `state_dict`."""
        self.wandb_id = state["wandb_id"]

    def matrix_range(self, name: str, matrix: np.ndarray) -> tuple[float, float]:
        """The colour range of matrices called `name`, fixed for the run: its kind's range, or the range of the
        first saved matrix of that name (which a resumed run finds on disk as well)."""
        from fedlight.reports import plots  # matplotlib loads only once a run logs a matrix

        if name not in self.matrix_ranges:
            saved = sorted((self.run_dir / "matrices").glob(f"{name.replace('/', '_')}_round*.npy"))
            self.matrix_ranges[name] = plots.matrix_range(name, np.load(saved[0]) if saved else matrix)
        return self.matrix_ranges[name]

    def _payload(
        self,
        round: int,
        scalars: dict[str, Any],
        per_client: dict[str, np.ndarray],
        rows: list[dict[str, Any]],
        matrices: dict[str, np.ndarray],
    ) -> dict[str, Any]:
        import wandb

        from fedlight.reports import plots

        payload: dict[str, Any] = {k: v for k, v in scalars.items() if k != "round" and isinstance(v, (int, float))}
        for name, matrix in matrices.items():
            matrix = np.asarray(matrix, dtype=float)
            figure = plots.heatmap_figure(
                [(f"{name}, round {round}", matrix)], *self.matrix_range(name, matrix), label=name
            )
            payload[f"matrices/{name}"] = wandb.Image(figure, caption=f"{name}, round {round}")
        if rows:
            columns = list(dict.fromkeys(k for r in rows for k in r))  # held-out clients' rows have no train/*
            payload["clients/table"] = wandb.Table(
                columns=columns,  # type: ignore[arg-type]  # hinted list[str | int]
                data=[[r.get(k) for k in columns] for r in rows],
            )
        for name, values in per_client.items():
            if name in CONSTANT_COLUMNS:
                continue
            finite = values[np.isfinite(values)]
            if len(finite):
                payload[f"clients/{name}_hist"] = wandb.Histogram(finite)
            if len(values) <= self.settings.per_client_max:
                payload.update({f"clients/{name}/{c:03d}": float(v) for c, v in enumerate(values)})
        return payload
