"""Evaluation's rows a forward pass on this machine (`federation.eval_batch_size`): images a second of each network's
forward pass over the same random images, in evaluation's channels-last layout (`fedlight.plugin.channels_last`), the
row counts taking turns in one process (the order reversed every other pass); medians and bests over --repeats.

    python benchmarks/eval_rows.py --rows 128 256 512 --repeats 6

On a CPU a pass whose activation is larger than glibc's 32 MB ceiling for reusing freed memory gets fresh pages from
the kernel at every pass, and pays their faults: LEAF's CNN holds 100 KB a row after its first convolution, 51 MB at
512 rows. The CPU's rows, fitted to each network's activations (`fedlight.plugin.eval_rows`), come from this table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from fedlight.models import FedAvgCNN, FedTSDPCNN, LeafCNN, LeNet5, OCFLCNN, SmallCNN
from fedlight.plugin.channels_last import channels_last_on_cpu

NETWORKS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "leaf_cnn": (lambda: LeafCNN(num_classes=62), (1, 28, 28)),
    "fedavg_cnn": (lambda: FedAvgCNN(), (1, 28, 28)),
    "lenet5": (lambda: LeNet5(), (3, 32, 32)),
    "small_cnn": (lambda: SmallCNN(), (1, 8, 8)),
    "fedtsdp_cnn": (lambda: FedTSDPCNN(), (3, 32, 32)),
    "ocfl_cnn": (lambda: OCFLCNN(), (1, 28, 28)),
}


def images_per_second(network: nn.Module, images: torch.Tensor, rows: int) -> float:
    """One evaluation pass over `images`, `rows` at a time."""
    with torch.no_grad(), channels_last_on_cpu(network):
        network(images[:rows])  # the first call's costs out of the timing
        began = time.perf_counter()
        for start in range(0, len(images), rows):
            network(images[start : start + rows])
        return len(images) / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--rows", nargs="+", type=int, default=[128, 256, 512])
    parser.add_argument("--images", type=int, default=6144)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    built = {name: (NETWORKS[name][0]().eval(), torch.randn(args.images, *NETWORKS[name][1])) for name in args.networks}
    speeds: dict[tuple[str, int], list[float]] = {}
    for repeat in range(args.repeats):
        for name, (network, images) in built.items():
            for rows in args.rows if repeat % 2 == 0 else args.rows[::-1]:
                speeds.setdefault((name, rows), []).append(images_per_second(network, images, rows))
    print(f"images a second on {torch.get_num_threads()} threads, median (best) of {args.repeats} passes\n")
    print("| network | " + " | ".join(f"{rows} rows" for rows in args.rows) + " |")
    print("|---|" + "---|" * len(args.rows))
    for name in args.networks:
        cells = [speeds[(name, rows)] for rows in args.rows]
        print(f"| {name} | " + " | ".join(f"{statistics.median(c):,.0f} ({max(c):,.0f})" for c in cells) + " |")


if __name__ == "__main__":
    main()
