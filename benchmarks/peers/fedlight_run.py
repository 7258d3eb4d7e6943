"""fedlight on a peers workload, as a user writes it: a data module of the workload's clients, PFLlib's CNN in a
`Classifier`, FedAvg or FedPer, `clients_per_round`, the default (automatic) trainer; evaluation off. Prints
{"round_s": [...]} as one JSON line.

    python benchmarks/peers/fedlight_run.py --workload fedavg --rounds 5
"""

from __future__ import annotations

import time

import numpy as np
import torch

from workloads import print_rounds, Workload, client_data, network

from fedlight import Federation, FederationConfig
from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer
from fedlight.datamodules.base import FederatedDataModule
from fedlight.datamodules.partition import PartitionScheme
from fedlight.models import Classifier


class WorkloadClients(FederatedDataModule):
    """The workload's clients: client c's samples are `client_data(c)`, all for training."""

    def __init__(self, workload: Workload) -> None:
        super().__init__(
            num_clients=workload.clients, partition=InOrder(workload.samples), val_fraction=0.0, test_fraction=0.0
        )
        self.workload = workload

    @property
    def num_classes(self) -> int:
        return 10

    def load_pool(self):
        parts = [client_data(c, self.workload.samples) for c in range(self.workload.clients)]
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


class InOrder(PartitionScheme):
    """Client c holds pool rows [c * samples, (c + 1) * samples): the order `load_pool` wrote them in."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def assign(self, labels, num_clients, rng, owners=None) -> list[np.ndarray]:
        return [np.arange(c * self.samples, (c + 1) * self.samples) for c in range(num_clients)]


def run(workload: Workload, rounds: int) -> list[float]:
    """Seconds of each of `rounds` rounds."""
    algorithm = FedPer(personal_layers=1) if workload.method == "fedper" else FedAvg()
    config = FederationConfig(
        rounds=10**6,  # the run's last round is evaluated: these rounds are not its last
        clients_per_round=workload.per_round,
        batch_size=workload.batch_size,
        accelerator="cpu",
        eval_every=10**6,
        eval_split="train",  # the clients hold no test split; nothing is evaluated here
    )
    model = Classifier(network(), optimizer="sgd", lr=workload.lr)
    fed = Federation(WorkloadClients(workload), model, algorithm, config, seed=0)
    seconds = []
    for number in range(1, rounds + 1):
        began = time.perf_counter()
        fed.run_round(number)
        seconds.append(time.perf_counter() - began)
    return seconds


if __name__ == "__main__":
    print_rounds(run, __doc__)
