"""What a round's local training reports: each client's training loss and the values its `training_step` logged,
reduced across clients for metrics.csv and kept per client for clients.csv."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from fedlight.plugin.updates import Updates


class Processes(Protocol):
    """What a round's reports and updates need of the federation's processes (the engine's
    `fedlight.engine.processes.Collective` meets it; every method is the identity for one process)."""

    world: int
    rank: int

    @property
    def spread(self) -> bool:
        """Whether the federation runs on more than one process."""
        ...

    @property
    def device(self) -> torch.device:
        """Where this process's tensors live."""
        ...

    def sum_(self, tensor: Tensor) -> Tensor:
        """Sum `tensor` over the processes, in place."""
        ...

    def gather(self, tensor: Tensor) -> Tensor:
        """Every process's `tensor` (rows may differ in number), concatenated in rank order."""
        ...

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's picklable `obj`, in rank order."""
        ...


def gather_logs(processes: Processes, logs: dict[str, Tensor], rows: int, device: torch.device) -> dict[str, Tensor]:
    """Per-row logged values from every process (`rows` of them on this one); a name a process did not log, e.g.
    because it trained no client this round, is NaN for its rows."""
    names = sorted(set().union(*processes.gather_objects(set(logs))))
    return {name: processes.gather(logs.get(name, torch.full((rows,), float("nan"), device=device))) for name in names}


class TrainingStats:
    """Collects the updates of one round (whole, or a group at a time) as they pass to the algorithm."""

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self.parts: list[tuple[Tensor, Tensor, Tensor, dict[str, Tensor]]] = []

    def add(self, updates: Updates) -> Updates:
        """Record `updates` (returned unchanged, so this can sit in a generator of groups)."""
        self.parts.append((updates.clients, updates.train_loss.detach(), updates.num_samples, dict(updates.logs)))
        return updates

    def share(self, collective: Processes) -> None:
        """Replace what this process added by what every process added (when the round is spread over them)."""
        if not collective.spread:
            return
        device = collective.device

        def column(parts: list[Tensor], dtype: torch.dtype) -> Tensor:
            return torch.cat(parts) if parts else torch.zeros(0, dtype=dtype, device=device)

        clients = column([c for c, _, _, _ in self.parts], torch.long)
        losses = column([loss for _, loss, _, _ in self.parts], torch.float32)
        sizes = column([n for _, _, n, _ in self.parts], torch.long)
        names = dict.fromkeys(name for *_, logs in self.parts for name in logs)
        logs = {
            name: torch.cat([logs.get(name, torch.full_like(loss, float("nan"))) for _, loss, _, logs in self.parts])
            for name in names
        }
        self.parts = [
            (
                collective.gather(clients),
                collective.gather(losses),
                collective.gather(sizes),
                gather_logs(collective, logs, len(clients), device),
            )
        ]

    def _columns(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """(clients, name -> per-row values incl. 'loss', training-set sizes) of everything added, on the host, in
        client order: the means then do not depend on how the clients were grouped or spread over processes."""
        if not self.parts:
            return np.zeros(0, dtype=np.int64), {"loss": np.zeros(0)}, np.zeros(0)
        clients = torch.cat([c for c, *_ in self.parts]).cpu().numpy()
        sizes = torch.cat([n for _, _, n, _ in self.parts]).double().cpu().numpy()
        values = {"loss": torch.cat([loss for _, loss, _, _ in self.parts]).double().cpu().numpy()}
        for name in dict.fromkeys(k for *_, logs in self.parts for k in logs):
            values[name] = (
                torch.cat(
                    [
                        logs[name].double()
                        if name in logs
                        else torch.full_like(loss, float("nan"), dtype=torch.float64)
                        for _, loss, _, logs in self.parts
                    ]
                )
                .cpu()
                .numpy()
            )
        order = np.argsort(clients, kind="stable")
        return clients[order], {k: v[order] for k, v in values.items()}, sizes[order]

    def metrics(self) -> dict[str, float]:
        """`train/loss`: the clients' mean training loss; `train/<name>`: the training-set-size weighted mean of
        the clients' logged values (clients that did not log a name are left out)."""
        _, values, sizes = self._columns()
        losses = values.pop("loss")
        out = {"train/loss": float(losses.mean()) if len(losses) else float("nan")}
        for name, v in values.items():
            known = ~np.isnan(v)
            out[f"train/{name}"] = float(np.average(v[known], weights=sizes[known])) if known.any() else float("nan")
        return out

    def per_client(self) -> dict[str, np.ndarray]:
        """`train/<name>` for every client: its value this round, NaN for a client that did not train."""
        clients, values, _ = self._columns()
        out = {}
        for name, v in values.items():
            column = np.full(self.num_clients, np.nan)
            column[clients] = v
            out[f"train/{name}"] = column
        return out
