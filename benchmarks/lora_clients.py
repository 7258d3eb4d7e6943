"""Federated LoRA fine-tuning of a small pretrained text model: fedlight's trainers against a plain peft loop over the
same clients, and the memory a run takes as its clients grow.

    python benchmarks/lora_clients.py                 # speed: 10, 100 and 1,000 clients a round, both trainers, peft
    python benchmarks/lora_clients.py --memory        # memory: 100 and 1,000 clients, 10 a round
    python benchmarks/lora_clients.py --device cuda   # the same on a GPU (bf16-mixed)

Speed: one round of FedIT (every client trains the adapters and the head for one epoch of its 32 rows, AdamW 1e-3,
batch 16) on planted text, a random GPT-2-shaped model (hidden 64, 4 layers, 4 heads, 16 tokens a row, LoRA r 8 on
c_attn). Timed is the second round (the first holds the trainer probe and the warm-up), without evaluation: fedlight
with `vectorize: -1` (the probe's choice, vectorized groups sized by memory), `vectorize: 0` (one client at a time),
and a plain loop written as a peft user would (one PeftModel; per client: load the global adapters, a new AdamW, the
batches, the weighted sum of the adapters). Tokens a second count the non-padding tokens trained. Each measurement is a
process of its own (its peak memory its own: the resident set on the CPU, torch's peak allocation on a GPU), run one
after another, the methods interleaved within each repeat; the table gives the median over repeats.

Memory: FedSA-LoRA (every client keeps its own B, a client-state row) with 10 clients a round over 5 rounds, at 100 and
1,000 clients: the peak against the frozen base, the adapters' rows and the data, so that growing the clients tenfold
adds their rows and their data, not copies of the base.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZE = {"hidden": 64, "layers": 4, "heads": 4, "max_length": 16}
MEMORY_SIZE = {**SIZE, "hidden": 256}  # a base of 3.2 M entries: a copy per client would be 12.6 MB each
ROWS_PER_CLIENT, BATCH = 32, 16
ATTENTION = "sdpa"  # `--attention eager`: transformers' own attention (vmap batches it without a fallback)


def make_files(folder: Path, clients: int, size: dict[str, int] = SIZE) -> tuple[Path, Path]:
    """Planted text of `clients` x 32 rows and a random GPT-2-shaped model of `size` with its tokenizer."""
    from fedlight.datamodules.planted_text import write_planted
    from fedlight.models.tiny_pretrained import make_tiny

    corpus = write_planted(folder / f"planted-{clients}.jsonl", samples=clients * ROWS_PER_CLIENT)
    model = folder / f"gpt2-{size['hidden']}"
    if not (model / "config.json").is_file():
        make_tiny(
            "gpt2",
            model,
            corpus,
            num_classes=4,
            hidden=size["hidden"],
            layers=size["layers"],
            heads=size["heads"],
            max_length=size["max_length"],
        )
    return corpus, model


def peak_bytes(device: str) -> float:
    import torch

    if device == "cuda":
        return float(torch.cuda.max_memory_allocated())
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0


def federation(
    corpus: Path,
    model_path: Path,
    algorithm,
    clients: int,
    device: str,
    vectorize: int,
    rounds: int,
    per_round: int | None = None,
):
    import torch

    from fedlight import Federation, FederationConfig
    from fedlight.datamodules import TextFederated
    from fedlight.models import PretrainedClassifier

    torch.manual_seed(0)
    data = TextFederated(
        str(corpus),
        str(model_path),
        max_length=SIZE["max_length"],
        num_clients=clients,
        val_fraction=0.0,
        test_fraction=0.1,
    )
    model = PretrainedClassifier(str(model_path), num_classes=4, lr=1e-3, attention=ATTENTION)
    config = FederationConfig(
        rounds=rounds,
        local_epochs=1,
        batch_size=BATCH,
        accelerator=device,
        vectorize=vectorize,
        eval_every=rounds,
        clients_per_round=per_round,
        precision="bf16-mixed" if device == "cuda" else None,
    )
    return Federation(data, model, algorithm, config, seed=0)


def trained_tokens(x, pad_id: int) -> int:
    """The tokens one epoch over the training rows `x` trains: those that are not padding."""
    return int((x != pad_id).sum())


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def measure_fedlight(corpus: Path, model_path: Path, clients: int, device: str, vectorize: int) -> dict:
    from fedlight.algorithms.fedit import FedIT

    fed = federation(corpus, model_path, FedIT(), clients, device, vectorize, rounds=3)
    fed.run_round(1)  # the probe (vectorize -1) and the warm-up
    sync(device)
    start = time.perf_counter()
    fed.run_round(2)
    sync(device)
    seconds = time.perf_counter() - start
    tokens = trained_tokens(fed.data.train.x, fed.module.pad_id)
    return {
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "peak_bytes": peak_bytes(device),
        "trainer": fed.execution.plan.describe(),
    }


def measure_plain(corpus: Path, model_path: Path, clients: int, device: str) -> dict:
    """The loop a peft user writes: one PeftModel, each client trained from the global adapters in turn."""
    import torch
    import torch.nn.functional as F

    from fedlight.datamodules import TextFederated
    from fedlight.models import PretrainedClassifier

    torch.manual_seed(0)
    data = TextFederated(
        str(corpus),
        str(model_path),
        max_length=SIZE["max_length"],
        num_clients=clients,
        val_fraction=0.0,
        test_fraction=0.1,
    )
    data.setup()
    train = data.federated.train
    model = PretrainedClassifier(str(model_path), num_classes=4, lr=1e-3, attention=ATTENTION).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    global_state = [p.detach().clone() for p in trainable]
    x_all, y_all = train.x.to(device), train.y.to(device)
    bounds = train.bounds
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    def one_round() -> None:
        sums = [torch.zeros_like(p) for p in trainable]
        total = 0
        for c in range(clients):
            with torch.no_grad():
                for p, g in zip(trainable, global_state):
                    p.copy_(g)
            optimizer = torch.optim.AdamW(trainable, lr=1e-3)
            x, y = x_all[bounds[c] : bounds[c + 1]], y_all[bounds[c] : bounds[c + 1]]
            order = torch.randperm(len(y), device=device)
            for i in range(0, len(y), BATCH):
                rows = order[i : i + BATCH]
                with autocast:
                    loss = F.cross_entropy(model(x[rows]), y[rows])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            with torch.no_grad():
                for s, p in zip(sums, trainable):
                    s.add_(p, alpha=len(y))
            total += len(y)
        with torch.no_grad():
            for g, s in zip(global_state, sums):
                g.copy_(s / total)

    model.train()
    one_round()
    sync(device)
    start = time.perf_counter()
    one_round()
    sync(device)
    seconds = time.perf_counter() - start
    tokens = trained_tokens(train.x, model.pad_id)
    return {"seconds": seconds, "tokens_per_s": tokens / seconds, "peak_bytes": peak_bytes(device), "trainer": "peft"}


def measure_memory(corpus: Path, model_path: Path, clients: int, device: str) -> dict:
    from fedlight.algorithms.fedsalora import FedSALoRA

    fed = federation(corpus, model_path, FedSALoRA(), clients, device, vectorize=-1, rounds=5, per_round=10)
    setup_peak = peak_bytes(device)
    for round in range(1, 6):
        fed.run_round(round)
    stores = fed.client_states.stores.values()
    store_bytes = sum(store.stored_bytes for store in stores)
    rows = sum(len(store.touched()) for store in stores)
    data_bytes = sum(
        t.numel() * t.element_size()
        for split in (fed.data.train, fed.data.val, fed.data.test)
        for t in (split.x, split.y)
    )
    return {
        "peak_bytes": peak_bytes(device),
        "setup_peak_bytes": setup_peak,
        "base_bytes": fed.module.base_bytes(),
        "adapter_bytes": fed.module.trainable_bytes(),
        "personal_entries": int(fed.algorithm.personal_mask.sum()),
        "store_bytes": store_bytes,
        "store_rows": rows,
        "data_bytes": data_bytes,
    }


def child(args: argparse.Namespace) -> None:
    corpus, model_path = Path(args.corpus), Path(args.model)
    if args.what == "plain":
        result = measure_plain(corpus, model_path, args.clients, args.device)
    elif args.what == "memory":
        result = measure_memory(corpus, model_path, args.clients, args.device)
    else:
        result = measure_fedlight(corpus, model_path, args.clients, args.device, int(args.what))
    print("RESULT " + json.dumps(result))


def run_child(what: str, clients: int, corpus: Path, model: Path, device: str) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        what,
        "--clients",
        str(clients),
        "--corpus",
        str(corpus),
        "--model",
        str(model),
        "--device",
        device,
        "--attention",
        ATTENTION,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{what} at {clients} clients failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--attention", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--json", help="also write the measurements to this file")
    parser.add_argument("--child", dest="what")
    parser.add_argument("--corpus")
    parser.add_argument("--model")
    args = parser.parse_args()
    global ATTENTION
    ATTENTION = args.attention
    if args.what:
        args.clients = args.clients[0]
        return child(args)
    folder = Path(tempfile.mkdtemp(prefix="fedlight-lora-bench-"))
    if args.memory:
        print(
            "| clients (10 a round) | peak MB after set-up | peak MB after 5 rounds | frozen base MB | "
            "one client's adapters kB | client-state rows | data MB |\n|---|---|---|---|---|---|---|"
        )
        for clients in args.clients or [100, 1000]:
            corpus, model = make_files(folder, clients, MEMORY_SIZE)
            r = run_child("memory", clients, corpus, model, args.device)
            print(
                f"| {clients:,} | {r['setup_peak_bytes'] / 2**20:.0f} | {r['peak_bytes'] / 2**20:.0f} | "
                f"{r['base_bytes'] / 2**20:.2f} | "
                f"{r['adapter_bytes'] / 1e3:.1f} | {r['store_rows']} rows, {r['store_bytes'] / 1e3:.0f} kB | "
                f"{r['data_bytes'] / 2**20:.2f} |",
                flush=True,
            )
        return
    methods = {"-1": "fedlight (probe's choice)", "0": "fedlight (one client at a time)", "plain": "plain peft loop"}
    sizes = args.clients or [10, 100, 1000]
    files = {clients: make_files(folder, clients) for clients in sizes}
    results: dict[tuple[int, str], list[dict]] = {}
    for _ in range(args.repeats):
        for clients in sizes:
            for what in methods:
                results.setdefault((clients, what), []).append(run_child(what, clients, *files[clients], args.device))
    if args.json:
        Path(args.json).write_text(
            json.dumps([{"clients": c, "trainer": methods[w], "runs": rs} for (c, w), rs in results.items()], indent=1)
        )
    print(f"device: {args.device}; attention: {ATTENTION}; medians of {args.repeats}\n")
    print("| clients a round | trainer | tokens/s | round s | peak MB |\n|---|---|---|---|---|")
    for clients in sizes:
        for what, label in methods.items():
            rs = results[(clients, what)]
            print(
                f"| {clients:,} | {label} | {statistics.median(r['tokens_per_s'] for r in rs):,.0f} | "
                f"{statistics.median(r['seconds'] for r in rs):.2f} | "
                f"{statistics.median(r['peak_bytes'] for r in rs) / 2**20:.0f} |"
            )


if __name__ == "__main__":
    main()
