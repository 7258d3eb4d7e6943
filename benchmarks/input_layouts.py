"""The vectorized trainer's layouts on a CPU, timed side by side in one process: one round's local training of all
clients in one group, the same work each time, the ways taking turns (their order reversed every other repeat),
median wall seconds. Three ways:

- `as given`: the image batches as the data gives them, vmap's own rule for max-pooling;
- `cl inputs`: channels-last image batches, vmap's own pooling (the channels-last layout before client_pooling.py);
- `cl layout`: channels-last image batches and the clients max-pooled in their channels
  (`fedlight.training.client_pooling`): `VectorizedTrainer.channels_last_inputs` now.

    python benchmarks/input_layouts.py --networks lenet5 lenet5_bn fedavg_cnn small_cnn --repeats 6
    python benchmarks/input_layouts.py --networks leaf_cnn fedtsdp_cnn --batch_size 20 --pool 6000 --repeats 3

Data and networks as in vectorized.py (Dirichlet(0.5) over `--pool` random 1x28x28 images, 20 clients, one epoch),
with three more of the shipped networks: LEAF's CNN, SmallCNN and FedTSDP's CNN.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import fedlight.training.vectorized as vectorized_module
from fedlight.models import FedTSDPCNN, LeafCNN, SmallCNN
from vectorized import NETWORKS, build

LAYOUT_NETWORKS = {
    **NETWORKS,
    "leaf_cnn": lambda: LeafCNN(in_channels=1, num_classes=10, image_size=28),
    "small_cnn": lambda: SmallCNN(in_channels=1, num_classes=10, image_size=28),
    "fedtsdp_cnn": lambda: FedTSDPCNN(in_channels=1, num_classes=10, image_size=28),
}
WAYS = ("as given", "cl inputs", "cl layout")
OWN_POOLING = vectorized_module.clients_in_channels


def set_way(trainer, way: str) -> None:
    """Put the trainer in one of the WAYS (vmap's own pooling: the clients' rule replaced by a no-op)."""
    trainer.channels_last_inputs = way != "as given"
    vectorized_module.clients_in_channels = OWN_POOLING if way == "cl layout" else contextlib.nullcontext


def measure(args: argparse.Namespace, network: str) -> dict[str, float]:
    """Median wall seconds of one round's training in each way."""
    fed = build(args, network, args.batch_size, args.clients, networks=LAYOUT_NETWORKS)
    execution, clients = fed.execution, list(range(args.clients))
    trainer = execution.training.vectorized
    assert trainer is not None and trainer.layouts_differ, "the layouts differ only for a convolution on a CPU"
    wall: dict[str, list[float]] = {way: [] for way in WAYS}
    for way in WAYS:  # warm-up: each way's first-call costs
        set_way(trainer, way)
        execution.train(1, clients)
    for repeat in range(args.repeats):
        for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:
            set_way(trainer, way)
            began = time.perf_counter()
            execution.train(1, clients)
            wall[way].append(time.perf_counter() - began)
    set_way(trainer, "cl layout")
    return {way: statistics.median(seconds) for way, seconds in wall.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--networks", nargs="+", default=["lenet5"], choices=list(LAYOUT_NETWORKS))
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--pool", type=int, default=12_000)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    args.accelerator, args.precision = "cpu", "32-true"
    print("| network | batch | as given s | cl inputs s | cl layout s | cl layout vs as given | vs cl inputs |")
    print("|---|---|---|---|---|---|---|")
    for network in args.networks:
        s = measure(args, network)
        print(
            f"| {network} | {args.batch_size} | {s['as given']:.2f} | {s['cl inputs']:.2f} | {s['cl layout']:.2f} | "
            f"{s['as given'] / s['cl layout']:.2f}x | {s['cl inputs'] / s['cl layout']:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
