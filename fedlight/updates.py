"""What the clients of a round send back: one stacked tensor per field, row i belonging to `clients[i]`."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class Updates:
    """The trained models of a round's clients (or of one group of them), stacked."""

    clients: Tensor      # (m,) long, client ids
    params: Tensor       # (m, d) trained flat models
    starts: Tensor       # (m, d) the flat models each client started from
    num_samples: Tensor  # (m,) training-set sizes
    train_loss: Tensor   # (m,) mean training loss of the last local epoch
    logs: dict[str, Tensor] = field(default_factory=dict)  # name -> (m,) what training_step logged (self.log)

    @property
    def deltas(self) -> Tensor:
        """Each client's change to its starting model (trained minus start)."""
        return self.params - self.starts

    def __len__(self) -> int:
        return len(self.clients)

    def subset(self, rows: Tensor) -> "Updates":
        """The updates of the rows selected by a boolean mask or an index tensor."""
        return Updates(self.clients[rows], self.params[rows], self.starts[rows], self.num_samples[rows],
                       self.train_loss[rows], {name: value[rows] for name, value in self.logs.items()})
