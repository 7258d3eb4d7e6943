"""Vectorized against sequential client training: LeNet-5 clients, one local epoch at batch 10 on 28x28
inputs (random data of the real shapes), timing one round's local training.

    python benchmarks/vectorized.py --clients 20 --samples 600             # the CPU setting
    python benchmarks/vectorized.py --clients 100 --accelerator cuda --precision bf16-mixed
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules.base import FederatedDataModule
from fedlight.federation import Federation, FederationConfig
from fedlight.models import Classifier, LeNet5


class RandomImages(FederatedDataModule):
    """Random 1x28x28 images with 10 labels, `samples` per client (shapes of MNIST-like clients)."""

    def __init__(self, num_clients: int, samples: int) -> None:
        super().__init__(num_clients=num_clients, val_fraction=0.0, test_fraction=0.0)
        self.samples = samples

    @property
    def num_classes(self) -> int:
        return 10

    def load_pool(self):
        g = torch.Generator().manual_seed(0)
        n = self.num_clients * self.samples
        return torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def build(args: argparse.Namespace, vectorize: int) -> Federation:
    torch.manual_seed(0)
    model = Classifier(LeNet5(in_channels=1, num_classes=10, image_size=28), lr=0.01, momentum=0.5)
    config = FederationConfig(rounds=10**6, local_epochs=1, batch_size=args.batch_size, accelerator=args.accelerator,
                              precision=args.precision, eval_every=10**6, vectorize=vectorize)
    return Federation(RandomImages(args.clients, args.samples), model, FedAvg(), config)


def time_training(fed: Federation, rounds: int) -> list[float]:
    clients = list(range(fed.num_clients))
    fed.train_clients(1, clients)  # warm-up
    times = []
    for r in range(2, rounds + 2):
        if fed.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fed.train_clients(r, clients)
        if fed.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sequential = statistics.median(time_training(build(args, 0), args.rounds))
    vectorized_fed = build(args, -1)
    vectorized = statistics.median(time_training(vectorized_fed, args.rounds))
    result = {"device": str(vectorized_fed.device), "precision": vectorized_fed.precision, "clients": args.clients,
              "samples_per_client": args.samples, "batch_size": args.batch_size,
              "sequential_s": sequential, "vectorized_s": vectorized, "speedup": sequential / vectorized,
              "torch_threads": torch.get_num_threads()}
    print("| device | precision | clients | samples/client | batch | sequential s | vectorized s | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {result['device']} | {result['precision']} | {args.clients} | {args.samples} | {args.batch_size} | "
          f"{sequential:.3f} | {vectorized:.3f} | {result['speedup']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
