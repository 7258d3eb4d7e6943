"""One federation in 1 and in N processes (Fabric DDP: gloo on CPUs, NCCL on GPUs), timed side by side: each
repetition runs `python -m fedlight fit` once per process count, in turn, and reads the round times from the
run's metrics.csv (the first round, which holds start-up work, is left out). The table reports the median round
time of each and the speed-up against one process.

FedAvg with LeNet-5 on `--pool` random MNIST-size images cut into `--clients` clients (Dirichlet 0.5).

    python benchmarks/processes.py                                   # 1 and 2 processes on the CPU
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
    command = [sys.executable, "-m", "fedlight", "fit", "--data", "random_data.MnistLike",
               "--data.num_clients", str(args.clients), "--data.size", str(args.pool),
               "--model", "fedlight.models.Classifier", "--model.network", "fedlight.models.LeNet5",
               "--model.network.init_args.in_channels", "1", "--model.network.init_args.image_size", "28",
               "--model.lr", "0.01", "--model.momentum", "0.5", "--algorithm", "fedavg",
               "--federation.rounds", str(args.rounds), "--federation.batch_size", str(args.batch_size),
               "--federation.eval_split", "train", "--federation.eval_every", str(args.rounds),
               "--federation.vectorize", str(args.vectorize), "--federation.accelerator", args.accelerator,
               "--federation.devices", str(devices), "--logger.wandb", "false", "--output_dir", str(folder),
               "--run_name", name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    with (folder / name / "metrics.csv").open() as f:
        return [float(r["time/round_s"]) for r in csv.DictReader(f)][1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    times: dict[int, list[float]] = {d: [] for d in args.devices}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for devices in args.devices:
                times[devices] += run(args, devices, Path(tmp), f"d{devices}-r{repeat}")
    medians = {d: statistics.median(t) for d, t in times.items()}
    base = medians[args.devices[0]]
    rows = [{"devices": d, "accelerator": args.accelerator, "clients": args.clients, "vectorize": args.vectorize,
             "round_s": medians[d], "speedup": base / medians[d], "rounds_timed": len(times[d])} for d in args.devices]
    print("| accelerator | processes | clients | vectorize | median round s | speed-up |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['accelerator']} | {r['devices']} | {r['clients']} | {r['vectorize']} | {r['round_s']:.3f} | "
              f"{r['speedup']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
