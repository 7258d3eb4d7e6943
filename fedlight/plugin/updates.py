"""What the clients of a round send back, as the aggregation hooks read it.

`Updates` are stacked rows, row i belonging to `clients[i]`. `RoundUpdates` is the whole round's, handed to
`pre_aggregation`, `aggregate` and `post_aggregation`; how it delivers them is the algorithm's plan, fixed at
set-up by the algorithm's `Plan.holds_updates`:

- streamed (`Plan.holds_updates` False, FedAvg and every method that only averages): `groups()` trains this process's
  clients a group at a time as it is iterated, so memory holds one group's models; sums over the processes are
  taken once with `sum_over_processes_`, rows with `cat_over_processes`;
- held (`Plan.holds_updates` True, methods that compare every update): `all()` is the whole round, every process's
  clients gathered back in the single-process order, on every process; the two helpers then do nothing.

A client whose trained model, training loss or any row of its returned `state` is not finite is left out of both
and named in `left_out`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from fedlight.cluster.differences import Differences


@dataclass
class Updates:
    """The trained models of a round's clients (or of one group of them), stacked."""

    clients: Tensor  # (m,) long, client ids
    params: Tensor  # (m, d) trained flat models
    starts: Tensor  # (m, d) the flat models each client started from
    num_samples: Tensor  # (m,) training-set sizes
    train_loss: Tensor  # (m,) mean training loss of the last local epoch
    logs: dict[str, Tensor] = field(default_factory=dict)  # name -> (m,) what training_step logged (self.log)
    state: dict[str, Tensor] = field(default_factory=dict)  # name -> (m, ...) what an algorithm's own train_client
    #                                                          returned beside the model (a personal model, a variate)

    @property
    def deltas(self) -> Tensor:
        """Each client's change to its starting model (trained minus start)."""
        return self.params - self.starts

    def delta_rows(self, mask: Tensor | None = None) -> Differences:
        """Each client's change on the entries where `mask` is True (all entries when None), never built whole: rows
        and blocks of columns are built as they are read (`Differences`). A similarity matrix or a cluster mean of
        the changes then needs no (m, d) matrix besides the trained models (1.3 GB for 15 ResNet-34 clients)."""
        return Differences(self.params, self.starts, mask)

    def masked_deltas(self, mask: Tensor | None = None) -> Tensor:
        """Each client's change on the entries where `mask` is True (all entries when None), built in one (m, masked)
        matrix: `deltas[:, mask]` would hold the whole (m, d) change besides it."""
        return self.delta_rows(mask)[:]

    def __len__(self) -> int:
        return len(self.clients)

    def subset(self, rows: Tensor) -> "Updates":
        """The updates of the rows selected by a boolean mask or an index tensor."""
        return Updates(
            self.clients[rows],
            self.params[rows],
            self.starts[rows],
            self.num_samples[rows],
            self.train_loss[rows],
            {name: value[rows] for name, value in self.logs.items()},
            {name: value[rows] for name, value in self.state.items()},
        )
