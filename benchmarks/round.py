"""One federated round at scale: time and peak memory of a full round (every client trains one local epoch,
the server aggregates, every client's model is evaluated) for 100, 500 and 1000 clients, with LeNet-5 and the
CIFAR ResNet-18, full precision and AMP.

A fixed pool of CIFAR-10-shaped random images (`--pool`, default 50,000 as in CIFAR-10) is cut IID into the
clients, so more clients means smaller clients. Each configuration runs in its own process: one warm-up round,
then one timed round. Peak memory is what a round adds on top of what was held before it: data, model, server
state. On a GPU it is the timed round's peak allocated bytes; on a CPU, the peak resident memory over both
rounds (memory the warm-up round freed stays resident and is reused, so the timed round alone would hide it).
FedAvg takes its updates in groups (running sums), FedPer (last layer personal) also stores the personal part
of every client trained (a client state: `personal_gb` is its stored rows); neither holds all clients' models at
once, so their peak should not grow with clients x d.
`fedavg_whole_round` is FedAvg handed the whole round at once, as clustered methods that compare all updates
are: its peak grows with clients x d.

    python benchmarks/round.py                                            # CPU: LeNet-5
    python benchmarks/round.py --networks resnet18 --pool 2000 --precisions 32-true   # CPU, tiny clients
    python benchmarks/round.py --accelerator cuda --networks lenet5 resnet18
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from random_data import RandomImages
from timing import peak_rss_bytes, reset_peak_rss, resident_bytes, sync

from fedlight.algorithms.fedavg import FedAvg
from fedlight.algorithms.fedper import FedPer
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.models import Classifier, LeNet5, ResNet18

NETWORKS = {
    "lenet5": lambda norm: LeNet5(in_channels=3, num_classes=10, image_size=32),
    "resnet18": lambda norm: ResNet18(in_channels=3, num_classes=10, norm=norm),
}


class WholeRoundFedAvg(FedAvg):
    """FedAvg handed the whole round's updates at once, as a method that compares all updates (OCFL, CFL) is:
    the contrast that shows what aggregation in groups saves."""

    def pre_aggregation(self, round, updates) -> None:
        pass


ALGORITHMS = {"fedavg": FedAvg, "fedper": lambda: FedPer(personal_layers=1), "fedavg_whole_round": WholeRoundFedAvg}


def measure(network: str, clients: int, precision: str, algorithm: str, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    model = Classifier(NETWORKS[network](args.norm), lr=0.01, momentum=0.9)
    data = RandomImages(clients, max(5, args.pool // clients), channels=3, size=32, test_fraction=0.2)  # >= 1 test
    config = FederationConfig(
        rounds=10**6,
        local_epochs=1,
        batch_size=args.batch_size,
        accelerator=args.accelerator,
        precision=precision,
        eval_every=1,
        vectorize=args.vectorize,
    )
    started = time.perf_counter()
    fed = Federation(data, model, ALGORITHMS[algorithm](), config)
    setup_s = time.perf_counter() - started
    device = fed.device
    if device.type != "cuda":  # host memory freed by the warm-up round stays resident, so count from here
        reset_peak_rss()
        before = resident_bytes()
    fed.run_round(1)
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    started = time.perf_counter()
    fed.run_round(2)
    sync(device)
    round_s = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else peak_rss_bytes()
    return {
        "network": network,
        "clients": clients,
        "precision": fed.precision,
        "algorithm": algorithm,
        "device": str(device),
        "params": fed.flat.numel,
        "samples_per_client": data.samples,
        "vectorized": fed.execution.vectorized is not None,
        "setup_s": setup_s,
        "round_s": round_s,
        "peak_added_gb": (peak - before) / 1e9,
        "model_state_gb": fed.algorithm.models.numel() * 4 / 1e9,
        "personal_gb": 0.0 if fed.algorithm.personal is None else fed.algorithm.personal.stored_bytes / 1e9,
    }


def run_isolated(job: tuple, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        __file__,
        "--one",
        *map(str, job),
        "--accelerator",
        args.accelerator,
        "--pool",
        str(args.pool),
        "--batch_size",
        str(args.batch_size),
        "--norm",
        args.norm,
        "--vectorize",
        str(args.vectorize),
    ]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode:
        return {
            "network": job[0],
            "clients": job[1],
            "precision": job[2],
            "algorithm": job[3],
            "failed": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}",
        }
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--networks", nargs="+", default=["lenet5"], choices=sorted(NETWORKS))
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-mixed"])
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "fedper"], choices=sorted(ALGORITHMS))
    parser.add_argument("--pool", type=int, default=50_000, help="samples in all, cut into the clients")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument(
        "--norm",
        default="group",
        choices=["group", "batch"],
        help="ResNet-18 normalization (BatchNorm trains sequentially, GroupNorm vectorized)",
    )
    parser.add_argument("--vectorize", type=int, default=-1)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--one", nargs=4, metavar=("NETWORK", "CLIENTS", "PRECISION", "ALGORITHM"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        network, clients, precision, algorithm = args.one
        print(json.dumps(measure(network, int(clients), precision, algorithm, args)))
        return
    rows = []
    for network in args.networks:
        for precision in args.precisions:
            for algorithm in args.algorithms:
                for clients in args.clients:
                    rows.append(run_isolated((network, clients, precision, algorithm), args))
                    print(json.dumps(rows[-1]), file=sys.stderr)
    print(
        "| network | params | precision | algorithm | clients | samples/client | vectorized | round s | "
        "peak added GB | personal parts GB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(
                f"| {r['network']} | | {r['precision']} | {r['algorithm']} | {r['clients']} | | | "
                f"failed: {r['failed']} | | |"
            )
            continue
        print(
            f"| {r['network']} | {r['params']:,} | {r['precision']} | {r['algorithm']} | {r['clients']} | "
            f"{r['samples_per_client']} | {'yes' if r['vectorized'] else 'no'} | {r['round_s']:.2f} | "
            f"{r['peak_added_gb']:.3f} | {r['personal_gb']:.4f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
