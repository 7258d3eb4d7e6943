"""`self.log` and `self.log_dict` inside `training_step`, collected per client without reading values back.

While fedlight runs a module's `training_step`, `StepLogs` stands in for the module's `log` and `log_dict`: each
call keeps the value as a tensor (under `torch.func.vmap` a batched one, returned beside the loss), and the trainers
add it, weighted by the step's batch size, to per-client sums on the device. A client's value of a name is its
batch-size weighted mean over the steps of its last local epoch, as Lightning's `on_epoch` logging reduces it;
the engine then averages clients weighted by their training-set sizes into `train/<name>`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:  # type-only: importing Lightning costs seconds, and `fit --help` need not
    import lightning as L


class StepLogs:
    """Captures the values a module logs during one `training_step` call."""

    def __init__(self, module: L.LightningModule) -> None:
        self.module = module
        self.values: dict[str, Tensor] = {}

    def __enter__(self) -> "StepLogs":
        setattr(self.module, "log", self.log)  # instance attributes shadow the methods
        setattr(self.module, "log_dict", self.log_dict)
        return self

    def __exit__(self, *exc: Any) -> None:
        del self.module.log, self.module.log_dict

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's `log` signature; display and reduction options are ignored (see the module doc)."""
        tensor = value if isinstance(value, Tensor) else torch.as_tensor(float(value))
        self.values[name] = tensor.detach().float().reshape(())

    def log_dict(self, dictionary: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """Lightning's `log_dict` signature: `log` of each name and value (the options are ignored)."""
        for name, value in dictionary.items():
            self.log(name, value)

    def take(self) -> dict[str, Tensor]:
        """The values logged since the last call."""
        values, self.values = self.values, {}
        return values


class LogSums:
    """Per-client running sums of logged values, weighted by batch size, on the device."""

    def __init__(self, clients: int, device: torch.device) -> None:
        self.clients, self.device = clients, device
        self.sums: dict[str, Tensor] = {}
        self.weights: dict[str, Tensor] = {}

    def add(self, values: dict[str, Tensor], rows: Tensor | slice | int, batch_size: int) -> None:
        """Add each name's value (one per row in `rows`) with weight `batch_size`."""
        for name, value in values.items():
            if name not in self.sums:
                self.sums[name] = torch.zeros(self.clients, device=self.device)
                self.weights[name] = torch.zeros(self.clients, device=self.device)
            self.sums[name][rows] += value.to(self.device) * batch_size
            self.weights[name][rows] += batch_size

    def clear(self) -> None:
        """Zero every name's sums and weights (at each epoch's first step: the values kept are the last epoch's)."""
        for name in self.sums:
            self.sums[name].zero_()
            self.weights[name].zero_()

    def means(self) -> dict[str, Tensor]:
        """Each client's weighted mean of each name (NaN for a client that never logged it)."""
        return {name: self.sums[name] / self.weights[name] for name in self.sums}
