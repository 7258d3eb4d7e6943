"""Client training four ways, timed side by side: the plain PyTorch loop (`plain_loop.py`), fedlight's sequential
trainer (`vectorize: 0`), its vectorized trainer (all clients in one group) and the automatic choice
(`vectorize: -1`, which times both in the first round and keeps the faster). All four do the same training;
the table says how far each ends from the plain loop.

Data: `--pool` random 1x28x28 uint8 images (MNIST's size and storage) with 10 labels, cut into `--clients` clients
by Dirichlet(0.5) label skew; one local epoch of SGD (momentum 0.5) per round. Networks: LeNet-5, LeNet-5 with
BatchNorm, FedAvg's CNN as PFLlib and FL-bench build it (582,026 parameters) and a 2-layer MLP (784-200-10). Every
setting runs one warm-up round (the automatic choice's probe included), then `--repeats` rounds in which the four
take turns; the median of each is reported. Auto's choice is not remembered between runs (an empty
`FEDLIGHT_CACHE_DIR` each run), so it probes every time, as on a new machine.

    python benchmarks/vectorized.py                                  # the CPU table of docs/results.md (~40 min)
    python benchmarks/vectorized.py --networks lenet5 --pool 12000   # a quick look
    python benchmarks/vectorized.py --clients 100 --accelerator cuda --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from typing import Callable

import torch
from torch import nn

from plain_loop import PlainLoop
from random_data import MnistLike
from timing import interleaved_medians

from fedlight.algorithms.fedavg import FedAvg
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.models import MLP, Classifier, FedAvgCNN, LeNet5

NETWORKS: dict[str, Callable[[], nn.Module]] = {
    "lenet5": lambda: LeNet5(in_channels=1, num_classes=10, image_size=28),
    "lenet5_bn": lambda: LeNet5(in_channels=1, num_classes=10, image_size=28, batch_norm=True),
    "fedavg_cnn": lambda: FedAvgCNN(in_channels=1, num_classes=10, image_size=28),
    "mlp": lambda: MLP(784, [200], 10),
}
LR, MOMENTUM = 0.01, 0.5


def build(
    args: argparse.Namespace,
    network: str,
    batch_size: int,
    vectorize: int,
    networks: dict[str, Callable[[], nn.Module]] = NETWORKS,
) -> Federation:
    torch.manual_seed(0)
    model = Classifier(networks[network](), lr=LR, momentum=MOMENTUM)
    config = FederationConfig(
        rounds=10**6,
        local_epochs=1,
        batch_size=batch_size,
        accelerator=args.accelerator,
        precision=args.precision,
        eval_every=10**6,
        eval_split="train",
        vectorize=vectorize,
    )
    return Federation(MnistLike(args.clients, args.pool), model, FedAvg(), config)


def measure(args: argparse.Namespace, network: str, batch_size: int) -> dict:
    """One row of the table: the four trainers on one network and batch size."""
    feds = {
        "sequential": build(args, network, batch_size, 0),
        "vectorized": build(args, network, batch_size, args.clients),
        "auto": build(args, network, batch_size, -1),
    }
    plain = PlainLoop(feds["sequential"], NETWORKS[network], lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM))
    clients = list(range(args.clients))
    runs = {"plain": plain.round, **{name: fed.run_round for name, fed in feds.items()}}
    first = {name: run(1) for name, run in runs.items()}  # warm-up (and the automatic choice's probe)
    del first
    names = [e.name for e in feds["sequential"].flat.entries]
    reference = plain.flat_global(names)
    differences = {name: float((fed.algorithm.models[0] - reference).abs().max()) for name, fed in feds.items()}
    median = interleaved_medians(runs, args.repeats, feds["auto"].device)
    probe = feds["auto"].execution.probe_result
    sizes = feds["sequential"].data.train.sizes()
    return {
        "network": network,
        "params": feds["sequential"].flat.numel,
        "batch_size": batch_size,
        "clients": args.clients,
        "samples": int(sizes.sum()),
        "smallest_client": int(sizes.min()),
        "largest_client": int(sizes.max()),
        "device": str(feds["auto"].device),
        "precision": feds["auto"].precision,
        **{f"{name}_s": median[name] for name in runs},
        "auto_choice": probe.choice if probe else "vectorized",
        "probe": probe.as_dict() if probe else None,
        "max_difference_vs_plain": differences,
        "torch_threads": torch.get_num_threads(),
        "round_clients": len(clients),
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| network | params | batch | plain loop s | sequential s | vectorized s | auto s (choice) | "
        "auto vs plain | vectorized vs plain | max diff to plain (seq, vec, auto) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["max_difference_vs_plain"]
        lines.append(
            f"| {r['network']} | {r['params']:,} | {r['batch_size']} | {r['plain_s']:.2f} | "
            f"{r['sequential_s']:.2f} | {r['vectorized_s']:.2f} | {r['auto_s']:.2f} ({r['auto_choice']}) | "
            f"{r['plain_s'] / r['auto_s']:.2f}x | {r['plain_s'] / r['vectorized_s']:.2f}x | "
            f"{d['sequential']:.0e}, {d['vectorized']:.0e}, {d['auto']:.0e} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    parser.add_argument("--batch_sizes", nargs="+", type=int, default=[10, 64])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--pool", type=int, default=70_000, help="images cut into the clients")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds of each trainer (median)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.environ["FEDLIGHT_CACHE_DIR"] = tempfile.mkdtemp()  # auto probes every time, as on a new machine
    rows = []
    for network in args.networks:
        for batch_size in args.batch_sizes:
            rows.append(measure(args, network, batch_size))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
