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
import statistics
import time

import torch
import torch.nn.functional as F

from fedlight.algorithms.fedavg import FedAvg
from fedlight.datamodules import DigitsFederated
from fedlight.federation import Federation, FederationConfig
from fedlight.models import Classifier, SmallCNN


def build(args: argparse.Namespace, vectorize: int = 0) -> Federation:
    torch.manual_seed(0)
    model = Classifier(SmallCNN(1, 10, 8), optimizer="sgd", lr=0.05, momentum=0.9)
    config = FederationConfig(rounds=10**6, local_epochs=args.local_epochs, batch_size=args.batch_size,
                              accelerator=args.accelerator, precision=args.precision, eval_every=10**6,
                              vectorize=vectorize)
    return Federation(DigitsFederated(num_clients=args.clients), model, FedAvg(), config, seed=0)


class PlainLoop:
    """The same FedAvg round written directly in PyTorch: state dicts, a fresh optimizer per client."""

    def __init__(self, fed: Federation) -> None:
        torch.manual_seed(0)
        self.net = SmallCNN(1, 10, 8).to(fed.device)
        self.global_state = {k: v.clone() for k, v in self.net.state_dict().items()}
        self.fed = fed
        self.autocast = fed.fabric.autocast

    def round(self, round: int) -> None:
        fed, net = self.fed, self.net
        states, sizes = [], []
        for client in range(fed.num_clients):
            net.load_state_dict(self.global_state)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
            x, y = fed.data.train.client(client)
            seed = fed.client_seed(round, client)
            torch.manual_seed(seed)
            generator = torch.Generator(device=x.device).manual_seed(seed)
            net.train()
            for _ in range(fed.config.local_epochs):
                order = torch.randperm(len(y), generator=generator, device=x.device)
                for begin in range(0, len(y), fed.config.batch_size):
                    rows = order[begin: begin + fed.config.batch_size]
                    with self.autocast():
                        loss = F.cross_entropy(net(x[rows]), y[rows])
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
            states.append({k: v.clone() for k, v in net.state_dict().items()})
            sizes.append(len(y))
        total = sum(sizes)
        self.global_state = {k: sum(s[k] * (n / total) for s, n in zip(states, sizes)) for k in states[0]}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


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
    plain = PlainLoop(fed)
    fed.run_round(1), plain.round(1)  # warm-up, and the equivalence check below
    ours = fed.algorithm.models[0]
    theirs = torch.cat([plain.global_state[e.name.removeprefix("network.")].flatten() for e in fed.flat.entries])
    max_diff = float((ours - theirs).abs().max())
    vectorized = build(args, vectorize=-1)
    vectorized.run_round(1)
    times: dict[str, list[float]] = {"fedlight": [], "plain": [], "vectorized": []}
    for r in range(2, args.rounds + 2):
        for name, step in (("fedlight", fed.run_round), ("plain", plain.round), ("vectorized", vectorized.run_round)):
            sync(fed.device)
            started = time.perf_counter()
            step(r)
            sync(fed.device)
            times[name].append(time.perf_counter() - started)
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {"device": str(fed.device), "precision": fed.precision, "clients": args.clients,
              "local_epochs": args.local_epochs, "batch_size": args.batch_size, "rounds_timed": args.rounds,
              "fedlight_round_s": median["fedlight"], "plain_round_s": median["plain"],
              "ratio": median["fedlight"] / median["plain"], "max_param_diff_after_round_1": max_diff,
              "vectorized_round_s": median["vectorized"], "vectorized_speedup_vs_plain": median["plain"] / median["vectorized"],
              "torch_threads": torch.get_num_threads()}
    print("| device | precision | clients | fedlight s/round | plain s/round | ratio | max param diff | "
          "vectorized s/round | vectorized speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {result['device']} | {result['precision']} | {args.clients} | {median['fedlight']:.4f} | "
          f"{median['plain']:.4f} | {result['ratio']:.3f} | {max_diff:.2e} | {median['vectorized']:.4f} | "
          f"{result['vectorized_speedup_vs_plain']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
