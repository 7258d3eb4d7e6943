"""Vectorized against sequential client training: LeNet-5 clients, one local epoch at batch 10 on 28x28
inputs (random data of the real shapes), timing one round's local training three ways: the plain PyTorch loop
(`plain_loop.py`), fedlight's sequential trainer, and fedlight's vectorized trainer. All three do the same
training; the script reports how far their trained models are apart.

    python benchmarks/vectorized.py --clients 20 --samples 600             # the CPU setting
    python benchmarks/vectorized.py --clients 100 --accelerator cuda --precision bf16-mixed
"""
from __future__ import annotations

import argparse
import json

import torch

from plain_loop import PlainLoop
from random_data import RandomImages
from timing import interleaved_medians

from fedlight.algorithms.fedavg import FedAvg
from fedlight.federation import Federation, FederationConfig
from fedlight.models import Classifier, LeNet5


def build(args: argparse.Namespace, vectorize: int) -> Federation:
    torch.manual_seed(0)
    model = Classifier(LeNet5(in_channels=1, num_classes=10, image_size=28), lr=0.01, momentum=0.5)
    config = FederationConfig(rounds=10**6, local_epochs=1, batch_size=args.batch_size, accelerator=args.accelerator,
                              precision=args.precision, eval_every=10**6, eval_split="train", vectorize=vectorize)
    return Federation(RandomImages(args.clients, args.samples), model, FedAvg(), config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--samples", type=int, default=600)
    parser.add_argument("--batch_size", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of each")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sequential, vectorized = build(args, 0), build(args, -1)
    plain = PlainLoop(sequential, lambda: LeNet5(in_channels=1, num_classes=10, image_size=28),
                      lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.5))
    clients = list(range(args.clients))
    runs = {"plain": lambda r: plain.train_clients(r),
            "sequential": lambda r: sequential.train_clients(r, clients),
            "vectorized": lambda r: vectorized.train_clients(r, clients)}
    first = {name: run(1) for name, run in runs.items()}  # warm-up, and the equivalence check
    reference = torch.stack([torch.cat([s[e.name.removeprefix("network.")].flatten() for e in sequential.flat.entries])
                             for s in first["plain"][0]])
    max_diff = {name: float((first[name].params - reference).abs().max()) for name in ("sequential", "vectorized")}
    median = interleaved_medians(runs, args.rounds, sequential.device)
    result = {"device": str(vectorized.device), "precision": vectorized.precision, "clients": args.clients,
              "samples_per_client": args.samples, "batch_size": args.batch_size, "rounds_timed": args.rounds,
              "plain_s": median["plain"], "sequential_s": median["sequential"], "vectorized_s": median["vectorized"],
              "speedup_vs_plain": median["plain"] / median["vectorized"],
              "speedup_vs_sequential": median["sequential"] / median["vectorized"],
              "max_param_diff_vs_plain": max_diff, "torch_threads": torch.get_num_threads()}
    print("| device | precision | clients | samples/client | batch | plain loop s | fedlight sequential s | "
          "vectorized s | speed-up vs plain | max diff (seq, vec) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {result['device']} | {result['precision']} | {args.clients} | {args.samples} | {args.batch_size} | "
          f"{median['plain']:.3f} | {median['sequential']:.3f} | {median['vectorized']:.3f} | "
          f"{result['speedup_vs_plain']:.2f}x | {max_diff['sequential']:.1e}, {max_diff['vectorized']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
