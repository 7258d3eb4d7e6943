"""One federation in 1 and in N processes (Fabric DDP: gloo on CPUs, NCCL on GPUs), timed side by side: each
repetition runs `python -m fedlight fit` once per process count, in turn, and reads the round times from the
run's metrics.csv (the first round, which holds start-up work, is left out). The table reports the median round
time of each and the speed-up against one process.

FedAvg with LeNet-5 on `--pool` random MNIST-size images cut into `--clients` clients (Dirichlet 0.5). With
`--plain`, the plain PyTorch loop (`plain_loop.py`: the same training, one client after another, in one process
with every thread) takes its turn in each repetition too, in a fresh process, and the speed-ups are against it.

    python benchmarks/processes.py                                   # 1 and 2 processes on the CPU
    python benchmarks/processes.py --plain --batch_size 10 --vectorize 20 --pool 70000   # against the plain loop
    python benchmarks/processes.py --accelerator cuda --devices 1 2 4 8
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(args: argparse.Namespace, devices: int, folder: Path, name: str) -> list[float]:
    """The round times (s) of one run with `devices` processes, the first round left out."""
    command = [
        sys.executable,
        "-m",
        "fedlight",
        "fit",
        "--data",
        "random_data.MnistLike",
        "--data.num_clients",
        str(args.clients),
        "--data.size",
        str(args.pool),
        "--model",
        "fedlight.models.Classifier",
        "--model.network",
        "fedlight.models.LeNet5",
        "--model.network.init_args.in_channels",
        "1",
        "--model.network.init_args.image_size",
        "28",
        "--model.lr",
        "0.01",
        "--model.momentum",
        "0.5",
        "--algorithm",
        "fedavg",
        "--federation.rounds",
        str(args.rounds),
        "--federation.batch_size",
        str(args.batch_size),
        "--federation.eval_split",
        "train",
        "--federation.eval_every",
        str(args.rounds),
        "--federation.vectorize",
        str(args.vectorize),
        "--federation.accelerator",
        args.accelerator,
        "--federation.devices",
        str(devices),
        "--logger.wandb",
        "false",
        "--output_dir",
        str(folder),
        "--run_name",
        name,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    with (folder / name / "metrics.csv").open() as f:
        return [float(r["time/round_s"]) for r in csv.DictReader(f)][1:]


def plain_rounds(args: argparse.Namespace) -> list[float]:
    """The round times (s) of the plain loop on the same clients and training, the first round left out, from a
    fresh process (`--plain_worker`)."""
    command = [
        sys.executable,
        __file__,
        "--plain_worker",
        "--clients",
        str(args.clients),
        "--pool",
        str(args.pool),
        "--batch_size",
        str(args.batch_size),
        "--rounds",
        str(args.rounds),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])[1:]


def plain_worker(args: argparse.Namespace) -> None:
    """Print the plain loop's round times as JSON: `run`'s federation (data, seed, LeNet-5, SGD), trained by hand."""
    import time

    import torch

    from plain_loop import PlainLoop
    from random_data import MnistLike
    from vectorized import LR, MOMENTUM, NETWORKS

    from fedlight.algorithms.fedavg import FedAvg
    from fedlight.engine.federation import Federation, FederationConfig
    from fedlight.models import Classifier

    network = NETWORKS["lenet5"]
    config = FederationConfig(
        rounds=args.rounds,
        local_epochs=1,
        batch_size=args.batch_size,
        accelerator="cpu",
        eval_every=10**6,
        eval_split="train",
        vectorize=0,
    )
    torch.manual_seed(0)
    fed = Federation(
        MnistLike(args.clients, args.pool), Classifier(network(), lr=LR, momentum=MOMENTUM), FedAvg(), config
    )
    plain = PlainLoop(fed, network, lambda p: torch.optim.SGD(p, lr=LR, momentum=MOMENTUM))
    times = []
    for round in range(1, args.rounds + 1):
        began = time.perf_counter()
        plain.round(round)
        times.append(time.perf_counter() - began)
    print(json.dumps(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plain", action="store_true", help="time the plain PyTorch loop too, as the baseline")
    parser.add_argument("--plain_worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--pool", type=int, default=12_000)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--vectorize", type=int, default=0, help="0: one client at a time in each process")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.plain_worker:
        return plain_worker(args)
    times: dict[int | str, list[float]] = {d: [] for d in (["plain"] if args.plain else []) + args.devices}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for devices in times:
                times[devices] += (
                    plain_rounds(args) if devices == "plain" else run(args, devices, Path(tmp), f"d{devices}-r{repeat}")
                )
    medians = {d: statistics.median(t) for d, t in times.items()}
    base = next(iter(medians.values()))
    rows = [
        {
            "devices": d,
            "accelerator": args.accelerator,
            "clients": args.clients,
            "batch_size": args.batch_size,
            "vectorize": "plain loop" if d == "plain" else args.vectorize,
            "round_s": medians[d],
            "speedup": base / medians[d],
            "rounds_timed": len(times[d]),
        }
        for d in times
    ]
    print("| accelerator | processes | clients | batch | vectorize | median round s | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['accelerator']} | {1 if r['devices'] == 'plain' else r['devices']} | {r['clients']} | "
            f"{r['batch_size']} | {r['vectorize']} | {r['round_s']:.3f} | {r['speedup']:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
