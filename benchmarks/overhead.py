"""fedlight's FedAvg round against a plain PyTorch loop doing exactly the same training.

Same network, same initial weights, same client data, same batch order (the plain loop draws its permutations
from the same per-client seeds), same optimizer and steps. The script checks that both end with the same
global model, then times rounds of each, interleaved, and prints the median times and their ratio. fedlight
trains clients one after another here (`vectorize=0`), as the plain loop does; a third column times the same
round with fedlight's vectorized client training (the default), which is not the same computation order.

    python benchmarks/overhead.py                      # CPU, 20 digits clients, SmallCNN
    python benchmarks/overhead.py --accelerator cuda --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import json

import torch

from plain_loop import PlainLoop
from timing import interleaved_medians

from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import DigitsFederated
from fedlight.engine.federation import Federation, FederationConfig
from fedlight.models import Classifier, SmallCNN


def build(args: argparse.Namespace, vectorize: int = 0) -> Federation:
    torch.manual_seed(0)
    model = Classifier(SmallCNN(1, 10, 8), optimizer="sgd", lr=0.05, momentum=0.9)
    config = FederationConfig(
        rounds=10**6,
        local_epochs=args.local_epochs,
        batch_size=args.batch_size,
        accelerator=args.accelerator,
        precision=args.precision,
        eval_every=10**6,
        vectorize=vectorize,
    )
    return Federation(DigitsFederated(num_clients=args.clients), model, FedAvg(), config, seed=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds of each")
    parser.add_argument("--local_epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()

    fed = build(args)
    plain = PlainLoop(fed, lambda: SmallCNN(1, 10, 8), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))
    fed.run_round(1), plain.round(1)  # warm-up, and the equivalence check below
    theirs = plain.flat_global([e.name for e in fed.flat.entries])
    max_diff = float((fed.algorithm.models[0] - theirs).abs().max())
    vectorized = build(args, vectorize=-1)
    vectorized.run_round(1)
    median = interleaved_medians(
        {"fedlight": fed.run_round, "plain": plain.round, "vectorized": vectorized.run_round}, args.rounds, fed.device
    )
    result = {
        "device": str(fed.device),
        "precision": fed.precision,
        "clients": args.clients,
        "local_epochs": args.local_epochs,
        "batch_size": args.batch_size,
        "rounds_timed": args.rounds,
        "fedlight_round_s": median["fedlight"],
        "plain_round_s": median["plain"],
        "ratio": median["fedlight"] / median["plain"],
        "max_param_diff_after_round_1": max_diff,
        "vectorized_round_s": median["vectorized"],
        "vectorized_speedup_vs_plain": median["plain"] / median["vectorized"],
        "torch_threads": torch.get_num_threads(),
    }
    print(
        "| device | precision | clients | fedlight s/round | plain s/round | ratio | max param diff | "
        "vectorized s/round | vectorized speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {result['device']} | {result['precision']} | {args.clients} | {median['fedlight']:.4f} | "
        f"{median['plain']:.4f} | {result['ratio']:.3f} | {max_diff:.2e} | {median['vectorized']:.4f} | "
        f"{result['vectorized_speedup_vs_plain']:.2f}x |"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
