"""The workloads every peer runs (benchmarks/peers/run.py): one definition, read by the plain loop, fedlight and
Flower alike, so that they differ only in the framework around the same client work.

Each client holds random 28x28 one-channel images with 10 random labels (MNIST's shapes, drawn from a seed per
client: no download), trains PFLlib's CNN (`FedAvgCNN`, 582,026 parameters) for one epoch of SGD at batch 32, and the
server averages by training-set size; FedPer keeps each client's head (the last layer) at the client.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class Workload:
    """A federated workload: `clients` clients of `samples` images, `per_round` drawn a round, `method` FedAvg or
    FedPer, one local epoch of SGD (`lr`) at batch `batch_size`."""

    clients: int
    per_round: int
    samples: int
    method: str = "fedavg"
    batch_size: int = 32
    lr: float = 0.01


WORKLOADS = {
    # PFLlib's FedAvg setting: 100 clients of 600 images, 10 a round
    "fedavg": Workload(clients=100, per_round=10, samples=600),
    # the same with FedPer (Arivazhagan et al., 2019): a personal head per client, Flower's baseline
    "fedper": Workload(clients=100, per_round=10, samples=600, method="fedper"),
    # many small clients, where the cost a client (not a sample) decides: 100 a round of 50 images
    "many_small": Workload(clients=1000, per_round=100, samples=50),
}


def network() -> nn.Module:
    """PFLlib's CNN (conv5x5(32)-pool-conv5x5(64)-pool-FC 512-FC 10), the same initial weights in every peer."""
    from fedlight.models import FedAvgCNN

    torch.manual_seed(0)
    return FedAvgCNN(1, 10, 28)


HEAD = ("fc.weight", "fc.bias")  # FedAvgCNN's last layer: FedPer's personal part


def client_data(client: int, samples: int) -> tuple[Tensor, Tensor]:
    """Client `client`'s images (samples, 1, 28, 28) in [0, 1) and labels, the same in every peer."""
    generator = torch.Generator().manual_seed(1_000_003 * (client + 1))
    return torch.rand(samples, 1, 28, 28, generator=generator), torch.randint(0, 10, (samples,), generator=generator)


def clients_of_round(workload: Workload, round: int) -> list[int]:
    """The clients drawn in `round` (without replacement, from a seed a round), the same in every peer."""
    generator = torch.Generator().manual_seed(round)
    return torch.randperm(workload.clients, generator=generator)[: workload.per_round].tolist()


def train_client(net: nn.Module, x: Tensor, y: Tensor, workload: Workload, seed: int) -> None:
    """One local epoch of plain SGD on (x, y) at the workload's batch size, in place: the loop simulators run."""
    optimizer = torch.optim.SGD(net.parameters(), lr=workload.lr)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    net.train()
    for begin in range(0, len(y), workload.batch_size):
        rows = order[begin : begin + workload.batch_size]
        loss = F.cross_entropy(net(x[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def print_rounds(run: Callable[[Workload, int], list[float]], doc: str | None) -> None:
    """A peer's command line: `--workload NAME --rounds N`, then {"round_s": [...]} (`run`'s seconds of each round) as
    one JSON line, which run.py reads."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps({"round_s": run(WORKLOADS[args.workload], args.rounds)}))
