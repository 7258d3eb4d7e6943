"""`ClientWork`: what each client's local work actually ran, counted where it runs (`ClientPopulation`), so the
virtual clock charges a method what its clients did rather than one model's training and transfer a round.

Counted per client since the last `take`:
- `steps`: optimizer steps of local training (`train`, `train_many`) and the gradient passes of a custom local loop
  on the batches it drew (`batches`, `group_batches` with `server.model.loss_and_grad`, `group_loss_and_grad`: APFL's
  two models a batch are two steps, pFedMe's K inner iterations K), each a full batch as FedScale counts it;
- `forward_samples`: samples passed forward only, once per model (`losses`, `sample_losses`: IFCA's and FLIS's
  choice of a model by loss, FedEM's E-step, the candidates' losses of power-of-choice and Oort);
- `models_used`: the most models one client's work used in a round: the K models of a loss pass, or its training
  calls (a personal model beside the global one, FedEM's components): the models it received;
- `sent_bytes`: what its message carried beside the trained model (a model copy, a statistic, a per-client value),
  recorded by the engine as the message leaves the client.

`message_bytes` turns a round's counts into the bytes each client received and sent (`comm/*`), on the federated
entries only: a frozen pretrained base never travels, and neither do the entries a client keeps for itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from fedlight.plugin.training_stats import Processes


@dataclass(frozen=True)
class WorkDone:
    """What clients ran, (clients,) arrays indexed by client (see the module docstring)."""

    steps: np.ndarray
    forward_samples: np.ndarray
    models_used: np.ndarray
    sent_bytes: np.ndarray

    def __add__(self, other: "WorkDone") -> "WorkDone":
        return WorkDone(
            self.steps + other.steps,
            self.forward_samples + other.forward_samples,
            np.maximum(self.models_used, other.models_used),
            self.sent_bytes + other.sent_bytes,
        )


class ClientWork:
    """The running count of each client's work (see the module docstring)."""

    def __init__(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self._reset()

    def _reset(self) -> None:
        n = self.num_clients
        self._steps = np.zeros(n, dtype=np.int64)
        self._forward = np.zeros(n, dtype=np.float64)
        self._models = np.zeros(n, dtype=np.int64)
        self._calls = np.zeros(n, dtype=np.int64)
        self._sent = np.zeros(n, dtype=np.float64)

    def trained(self, clients: Sequence[int], steps: Sequence[int]) -> None:
        """A training call of `clients`, each running its `steps` optimizer steps (one model each)."""
        ids = np.asarray(clients, dtype=np.int64)
        np.add.at(self._steps, ids, np.asarray(steps, dtype=np.int64))
        np.add.at(self._calls, ids, 1)
        np.maximum.at(self._models, ids, self._calls[ids])

    def stepped(self, clients: Sequence[int], steps: int = 1) -> None:
        """`steps` gradient passes of a custom local loop on a batch of each of `clients` (their loop counted by
        `began`)."""
        np.add.at(self._steps, np.asarray(clients, dtype=np.int64), steps)

    def began(self, clients: Sequence[int]) -> None:
        """A custom local loop of `clients` began (one model each)."""
        ids = np.asarray(clients, dtype=np.int64)
        np.add.at(self._calls, ids, 1)
        np.maximum.at(self._models, ids, self._calls[ids])

    def forward(self, clients: Sequence[int], samples: Sequence[float], models: int, received: bool = True) -> None:
        """`models` models each passed forward over `samples` of each client's samples; `received`: the models came
        from the server (False: models the client keeps, such as its previous local model, or ones it already
        counts)."""
        ids = np.asarray(clients, dtype=np.int64)
        np.add.at(self._forward, ids, np.asarray(samples, dtype=np.float64) * models)
        if received:
            np.maximum.at(self._models, ids, models)

    def sent(self, clients: Sequence[int], sent_bytes: Sequence[float]) -> None:
        """What `clients`' messages carried beside the trained model, in bytes each."""
        np.add.at(self._sent, np.asarray(clients, dtype=np.int64), np.asarray(sent_bytes, dtype=np.float64))

    def share(self, processes: "Processes") -> None:
        """The counts of every process, when the round is spread over them: a client's training runs on one process
        and the server's work (a loss pass over every client) on all of them alike, so each count is the largest any
        process has."""
        if not processes.spread:
            return
        counts = [self._steps, self._forward, self._models, self._calls, self._sent]
        stacked = torch.as_tensor(np.stack([c.astype(np.float64) for c in counts]), device=processes.device)
        largest = processes.gather(stacked[None]).amax(dim=0).cpu().numpy()
        self._steps, self._forward, self._models, self._calls, self._sent = (
            largest[0].astype(np.int64),
            largest[1],
            largest[2].astype(np.int64),
            largest[3].astype(np.int64),
            largest[4],
        )

    def add(self, done: WorkDone) -> None:
        """Count `done` again (what `take` took out to measure a phase apart)."""
        self._steps += done.steps
        self._forward += done.forward_samples
        self._models = np.maximum(self._models, done.models_used)
        self._sent += done.sent_bytes

    def take(self) -> WorkDone:
        """What was counted since the last call, and a clean count."""
        done = WorkDone(self._steps, self._forward, self._models, self._sent)
        self._reset()
        return done


def message_bytes(done: WorkDone, clients: Sequence[int], model_bytes: float) -> dict[str, float]:
    """The `comm/*` scalars of a round: the mean and largest bytes a client of `clients` received (the models its work
    used, `model_bytes` each: the entries that travel) and sent (its model's, plus what its message carried beside
    it), and `model_bytes` itself."""
    if not len(clients):
        return {"comm/model_bytes": float(model_bytes)}
    ids = np.asarray(clients, dtype=np.int64)
    received = np.maximum(done.models_used[ids], 1) * float(model_bytes)
    sent = float(model_bytes) + done.sent_bytes[ids]
    return {
        "comm/model_bytes": float(model_bytes),
        "comm/received_bytes": float(received.mean()),
        "comm/received_bytes_max": float(received.max()),
        "comm/sent_bytes": float(sent.mean()),
        "comm/sent_bytes_max": float(sent.max()),
    }
