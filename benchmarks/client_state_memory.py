"""Peak resident memory of methods with per-client state at cross-device scale: 3,400 clients, 10 of them a round,
LEAF's FEMNIST CNN (`fedlight.models.LeafCNN`, 6.6 M parameters), 5 rounds.

Held as (clients x parameters) tensors, Ditto's personal models or SCAFFOLD's control variates would take
3,400 x 6.6 M x 4 bytes = 90 GB before round 1; in the engine's client-state store (`fedlight.engine.client_states`)
memory grows with the clients a run has touched (50 here) and the store's budget. Each method runs in a fresh
process (random 28 x 28 images, 10 a client, uint8 like FEMNIST's, 62 classes; W&B off); the peak is the process's
`ru_maxrss`. The issue's target: under 4 GB over 5 rounds.

    python benchmarks/client_state_memory.py [--methods ditto scaffold] [--clients 3400] [--rounds 5] [--memory GB]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
METHODS = {
    "ditto": "fedlight.algorithms.ditto:Ditto",
    "scaffold": "fedlight.algorithms.scaffold:SCAFFOLD",
    "fedavg": "fedlight.algorithms.fedavg:FedAvg",
    "apfl": "fedlight.algorithms.apfl:APFL",
    "pfedme": "fedlight.algorithms.pfedme:PFedMe",
    "fedem": "fedlight.algorithms.fedem:FedEM",
}
#: a method's arguments other than its defaults: pFedMe's default trains every client, which a cohort refuses
ARGUMENTS = {"pfedme": {"train_every_client": False}}


def run_one(method: str, clients: int, per_round: int, rounds: int, folder: Path, memory: float | None) -> dict:
    """One federation in this process; its peak resident memory and round times."""
    from fedlight import Federation, FederationConfig
    from fedlight.models import Classifier, LeafCNN
    from random_data import RandomImages  # benchmarks/ is on the path: this file's folder

    module_name, class_name = METHODS[method].split(":")
    algorithm = getattr(__import__(module_name, fromlist=[class_name]), class_name)(**ARGUMENTS.get(method, {}))
    torch.manual_seed(0)
    model = Classifier(LeafCNN(num_classes=62), lr=0.1)
    data = RandomImages(clients, 10, classes=62, uint8=True)  # FEMNIST's shapes, classes and storage
    config = FederationConfig(
        rounds=rounds,
        clients_per_round=per_round,
        batch_size=20,
        accelerator="cpu",
        eval_every=rounds,
        eval_split="train",
        eval_batch_size=512,
        client_state_memory=memory,
    )
    started = time.perf_counter()
    fed = Federation(data, model, algorithm, config)
    fed.client_states.use_folder(folder)  # rows beyond the memory budget go there (as a run folder's client_state/)
    setup_s = time.perf_counter() - started
    times, selected = [], []
    for number in range(1, rounds + 1):
        began = time.perf_counter()
        result = fed.run_round(number)
        times.append(time.perf_counter() - began)
        selected.append(result.clients_trained)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    stores = {
        name: f"{store.memory_bytes / 1e9:.2f} GB in memory, {store.spilled_rows} rows in its file"
        for name, store in fed.client_states.stores.items()
    }
    return {
        "method": method,
        "clients": clients,
        "per_round": selected,
        "params": fed.flat.numel,
        "setup_s": setup_s,
        "round_s": times,
        "peak_rss_gb": peak,
        "client_state": stores,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["ditto", "scaffold"], choices=list(METHODS))
    parser.add_argument("--clients", type=int, default=3400)
    parser.add_argument("--per_round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a worker: run this method and print JSON
    parser.add_argument("--folder", type=Path, default=Path("/tmp/fedlight-client-state-bench"))
    parser.add_argument(
        "--memory",
        type=float,
        default=None,
        help="federation.client_state_memory in GB (default: a quarter of the available memory)",
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.clients, args.per_round, args.rounds, args.folder, args.memory)))
        return
    for method in args.methods:
        command = [
            sys.executable,
            __file__,
            "--one",
            method,
            "--clients",
            str(args.clients),
            "--per_round",
            str(args.per_round),
            "--rounds",
            str(args.rounds),
            "--folder",
            str(args.folder / method),
            *(["--memory", str(args.memory)] if args.memory is not None else []),
        ]
        output = subprocess.run(
            command, check=True, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline"}
        ).stdout
        row = json.loads(output.strip().splitlines()[-1])
        rounds = ", ".join(f"{t:.1f}" for t in row["round_s"])
        print(
            f"{method:9s} {row['clients']} clients, {row['params']:,} parameters: "
            f"peak RSS {row['peak_rss_gb']:.2f} GB, "
            f"set-up {row['setup_s']:.1f} s, rounds {rounds} s; client state: {row['client_state'] or 'none'}"
        )


if __name__ == "__main__":
    main()
