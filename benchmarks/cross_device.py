"""Every method at cross-device scale: LEAF's FEMNIST size (3,550 writers), 10 writers a round, LEAF's CNN
(`fedlight.models.LeafCNN`), FLUTE's FEMNIST settings (batch 20, SGD lr 0.1, one local epoch).

The data module is the shipped configs' (configs/cross_device/femnist/common/data.yaml: 3,400 writers drawn from
LEAF's, 1,000 public images); its files are LEAF-format JSON files of made images (`femnist_load.py` writes
them; give their folder with --root, or let this script write them once into --root). Each method runs in a fresh
process, which loads FEMNIST (the cached parse after the first load), runs --rounds rounds without evaluation, then
evaluates every writer's model on its test split once. Beside every fedlight round, the same process runs a plain
PyTorch FedAvg round of the same clients (`plain_loop.PlainLoop`: the same steps on the same network, one client after
another), interleaved, so both see the same machine. Printed per method: the set-up's seconds (building the
federation: the algorithm's `setup`), seconds a round (median) and against the plain loop, the evaluation's seconds,
peak resident memory (`ru_maxrss`), and the client-state store's memory and file size. A method that refuses a cohort
smaller than all clients says why.

    python benchmarks/cross_device.py --root DIR [--methods fedavg ditto ...] [--rounds 5] [--per_round 10]
        [--json out.json] [--shipped_args]

Targets (issue "Cross-device scale"): FedAvg's round at most 1.2x the plain loop's; every method under 6 GB peak.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: methods whose round this benchmark runs by default: every registered algorithm
DEFAULT = "all"


def registered() -> list[str]:
    from fedlight.run.registry import short_names

    return sorted(short_names())


def shipped_data_args() -> dict:
    """The data module's arguments of the shipped cross-device configs (3,400 writers, 1,000 public images)."""
    import yaml

    return yaml.safe_load((ROOT / "configs/cross_device/femnist/common/data.yaml").read_text())["init_args"]


def shipped_algorithm_args(name: str) -> dict:
    """The algorithm's init_args in its shipped cross-device config (configs/cross_device/femnist/<name>.yaml); {}
    without one."""
    import yaml

    config = ROOT / "configs/cross_device/femnist" / f"{name}.yaml"
    algorithm = yaml.safe_load(config.read_text())["algorithm"] if config.is_file() else None
    return (algorithm.get("init_args") or {}) if isinstance(algorithm, dict) else {}  # a bare name: the defaults


def algorithm_class(name: str) -> type:
    import importlib

    from fedlight.run.registry import algorithm_path

    module, _, cls = algorithm_path(name).rpartition(".")
    return getattr(importlib.import_module(module), cls)


def run_one(
    method: str,
    root: Path,
    rounds: int,
    per_round: int,
    folder: Path,
    vectorize: int,
    data_args: dict | None = None,
    evaluate: bool = True,
    shipped_args: bool = False,
    state_memory: float | None = None,
) -> dict:
    """One method's federation in this process, with the plain loop's rounds interleaved (FedAvg's steps)."""
    from fedlight import Federation, FederationConfig
    from fedlight.datamodules import FEMNISTFederated
    from fedlight.models import Classifier, LeafCNN
    from plain_loop import PlainLoop

    started = time.perf_counter()
    data = FEMNISTFederated(**{**shipped_data_args(), **(data_args or {}), "root": str(root)})
    data.load_pool()
    load_s = time.perf_counter() - started
    torch.manual_seed(0)
    model = Classifier(LeafCNN(num_classes=62), lr=0.1)
    # no round of these is the run's last or an evaluated one: every writer is evaluated once, separately, below
    config = FederationConfig(
        rounds=10 * rounds + 100,
        clients_per_round=per_round,
        batch_size=20,
        local_epochs=1,
        accelerator="cpu",
        eval_every=10 * rounds + 100,
        vectorize=vectorize,
        client_state_memory=state_memory,
    )
    started = time.perf_counter()
    try:
        arguments = shipped_algorithm_args(method) if shipped_args else {}
        fed = Federation(data, model, algorithm_class(method)(**arguments), config, seed=0)
    except ValueError as refusal:
        return {"method": method, "refused": str(refusal).splitlines()[0]}
    fed.client_states.use_folder(folder)
    setup_s = time.perf_counter() - started
    plain = PlainLoop(fed, lambda: LeafCNN(num_classes=62), lambda p: torch.optim.SGD(p, lr=0.1))
    ours, theirs = [], []
    for number in range(1, rounds + 1):
        clients = fed.algorithm.select_clients(number)  # the base class's draw: FedAvg's clients this round
        began = time.perf_counter()
        fed.run_round(number)
        ours.append(time.perf_counter() - began)
        began = time.perf_counter()
        plain.round(number, clients)
        theirs.append(time.perf_counter() - began)
    began = time.perf_counter()
    summary, _ = fed.evaluate("test") if evaluate else ({}, None)
    eval_s = time.perf_counter() - began if evaluate else float("nan")
    stores = fed.client_states.stores.values()
    row = {
        "method": method,
        "writers": fed.num_clients,
        "params": fed.flat.numel,
        "load_s": load_s,
        "setup_s": setup_s,
        "round_s": ours,
        "plain_round_s": theirs,
        "eval_s": eval_s,
        "test_acc": summary.get("test/acc_mean"),
        "trainer": fed.execution.plan.trainer,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
        "state_memory_gb": sum(s.memory_bytes for s in stores) / 1e9,
        "state_file_gb": sum(s.stored_bytes - s.memory_bytes for s in stores) / 1e9,
    }
    if method == "fedavg":  # same steps: the two global models agree to float rounding
        flat = plain.flat_global([e.name for e in fed.flat.entries]).to(fed.algorithm.models.device)
        row["max_param_diff"] = float((fed.algorithm.models[0] - flat).abs().max())
    return row


def data_overrides(args: argparse.Namespace) -> dict:
    return {k: v for k, v in (("num_writers", args.num_writers), ("public_size", args.public_size)) if v is not None}


def in_a_fresh_process(method: str, args: argparse.Namespace) -> dict:
    line = [
        sys.executable,
        __file__,
        "--one",
        method,
        "--root",
        str(args.root),
        "--rounds",
        str(args.rounds),
        "--per_round",
        str(args.per_round),
        "--folder",
        str(args.folder / method),
        "--vectorize",
        str(args.vectorize),
        "--data_args",
        json.dumps(data_overrides(args)),
        *(["--no_eval"] if args.no_eval else []),
        *(["--shipped_args"] if args.shipped_args else []),
        *(["--state_memory", str(args.state_memory)] if args.state_memory is not None else []),
    ]
    done = subprocess.run(line, capture_output=True, text=True, cwd=HERE, env={**os.environ, "WANDB_MODE": "offline"})
    if done.returncode:
        return {
            "method": method,
            "failed": done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else f"exit status {done.returncode} (negative: killed by that signal), nothing on stderr",
        }
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    lines = [
        "| method | set-up s | round 1 s | s/round (median of later) | plain loop s/round | ratio "
        "| eval s (all writers) | peak RSS GB "
        "| state in memory GB | state file GB | trainer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "round_s" not in row:
            lines.append(
                f"| {row['method']} | {row.get('refused') or 'failed: ' + row.get('failed', '?')} | | | | | | | | | |"
            )
            continue
        later = slice(1, None) if len(row["round_s"]) > 1 else slice(None)  # round 1 also sets up (the probe)
        ours, theirs = statistics.median(row["round_s"][later]), statistics.median(row["plain_round_s"][later])
        lines.append(
            f"| {row['method']} | {row['setup_s']:.1f} | {row['round_s'][0]:.2f} | {ours:.2f} | {theirs:.2f} "
            f"| {ours / theirs:.2f} | {row['eval_s']:.1f} "
            f"| {row['peak_rss_gb']:.2f} | {row['state_memory_gb']:.2f} | {row['state_file_gb']:.2f} "
            f"| {row['trainer']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--root", type=Path, required=True, help="LEAF FEMNIST folder (train/, test/); written if empty"
    )
    parser.add_argument("--methods", nargs="+", default=[DEFAULT])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per_round", type=int, default=10)
    parser.add_argument("--vectorize", type=int, default=-1, help="federation.vectorize (-1: measured)")
    parser.add_argument(
        "--writers", type=int, default=None, help="writers to write when --root is empty (LEAF's 3,550)"
    )
    parser.add_argument("--num_writers", type=int, default=None, help="default: the shipped configs' 3,400")
    parser.add_argument("--public_size", type=int, default=None, help="default: the shipped configs' 1,000")
    parser.add_argument("--no_eval", action="store_true", help="skip the evaluation of every writer")
    parser.add_argument(
        "--shipped_args",
        action="store_true",
        help="each method's init_args from its shipped config (configs/cross_device/femnist/), not "
        "the class defaults (FLIS-DC's default val split is empty in this setting)",
    )
    parser.add_argument(
        "--state_memory",
        type=float,
        default=None,
        help="federation.client_state_memory in GB (default: a quarter of the available memory)",
    )
    parser.add_argument("--data_args", type=json.loads, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/fedlight-cross-device"), help="client-state files")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a worker: one method, JSON on stdout
    args = parser.parse_args()
    if args.one:
        print(
            json.dumps(
                run_one(
                    args.one,
                    args.root,
                    args.rounds,
                    args.per_round,
                    args.folder,
                    args.vectorize,
                    args.data_args,
                    not args.no_eval,
                    args.shipped_args,
                    args.state_memory,
                )
            )
        )
        return
    if not (args.root / "train").is_dir():
        from femnist_load import LEAF_IMAGES, LEAF_WRITERS, leaf_writers, write_leaf

        writers = args.writers or LEAF_WRITERS
        write_leaf(
            args.root,
            writers=leaf_writers(writers, round(writers * LEAF_IMAGES / LEAF_WRITERS)),
            files=-(-writers // 100),
            ink=0.2,
        )
    methods = registered() if args.methods == [DEFAULT] else args.methods
    rows = []
    for method in methods:
        rows.append(in_a_fresh_process(method, args))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\n{args.per_round} of {rows[0].get('writers', '?')} writers a round, {args.rounds} rounds, LeafCNN\n")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
