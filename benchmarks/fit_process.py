"""The whole `fedlight fit` process on the cross-device workload against a plain PyTorch loop in a process of its
own: fresh processes taking turns, so both see the same machine.

fedlight's side is what a user runs: `python -m fedlight fit --config configs/cross_device/femnist/fedavg.yaml` on
FEMNIST at LEAF's size made in memory (`made_femnist.MadeFemnist`: 3,400 writers, LeafCNN, 10 writers a round),
with its CSV files, W&B offline and a checkpoint every round. A callback of this module (`RoundClock`, added by the
config's `callbacks:`) notes the time at every round's end, so a round's seconds here are the whole cycle: training,
aggregation, every callback and the previous round's checkpoint, not only `time/round_s`. The plain side
(`plain_loop.PlainLoop`) trains the same writers of every round with the same seeds and averages their state dicts;
it writes nothing. Compared: the median over rounds 2 to R-1 (round 1 holds fedlight's trainer probe, round R its
evaluation of every writer).

    cd benchmarks && python fit_process.py [--rounds 10] [--repeats 3] [--json out.json]
    git worktree add /tmp/before COMMIT && python fit_process.py --before /tmp/before   # a change's effect, A/B

`--before TREE` adds a third arm taking turns with the two: the same command run by the fedlight of another checkout
(its folder first on PYTHONPATH), so a change's effect is measured beside the noise of the day.

Target (the evidence issue): fedlight's round at most 1.1x the plain loop's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedlight.run.callbacks import Callback

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIG = ROOT / "configs/cross_device/femnist/fedavg.yaml"


class RoundClock(Callback):
    """A run callback writing `time.perf_counter()` at every round's end, one line a round, to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_round_end(self, run: Any, result: Any) -> None:
        with open(self.path, "a") as f:
            f.write(f"{result.round} {time.perf_counter()}\n")


def cycle_seconds(clock_file: Path) -> list[float]:
    """Seconds between consecutive rounds' ends (round 2's first)."""
    times = [float(line.split()[1]) for line in clock_file.read_text().splitlines()]
    return [b - a for a, b in zip(times, times[1:])]


def fedlight_process(rounds: int, folder: Path, tree: Path | None = None) -> dict:
    """One `fedlight fit` process (the fedlight of checkout `tree`, default this one); its round cycles from
    `RoundClock` and its `time/round_s` from metrics.csv."""
    import csv

    clock = folder / "clock.txt"
    callbacks = json.dumps([{"class_path": "fit_process.RoundClock", "init_args": {"path": str(clock)}}])
    line = [sys.executable, "-m", "fedlight", "fit", "--config", str(CONFIG), "--data", "made_femnist.MadeFemnist"]
    line += ["--federation.rounds", str(rounds), "--output_dir", str(folder), "--callbacks", callbacks]
    first = [str(tree)] if tree is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*first, str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.setdefault("WANDB_MODE", "offline")
    began = time.perf_counter()
    done = subprocess.run(line, cwd=HERE, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - began
    if done.returncode:
        raise SystemExit(f"fedlight fit failed:\n{done.stderr[-2000:]}")
    (metrics,) = folder.glob("*/metrics.csv")
    with metrics.open() as f:
        reported = [float(row["time/round_s"]) for row in csv.DictReader(f)]
    # cycle k runs from round k's end to round k+1's: round k+1 and round k's checkpoint
    return {"cycle_s": cycle_seconds(clock), "time_round_s": reported, "wall_s": wall}


def plain_process(rounds: int) -> dict:
    """The plain loop in a fresh process: the same data, writers and seeds."""
    line = [sys.executable, __file__, "--plain_one", str(rounds)]
    done = subprocess.run(line, cwd=HERE, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "offline"})
    if done.returncode:
        raise SystemExit(f"the plain loop failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_plain(rounds: int) -> dict:
    """Inside the plain process: FedAvg's draw of writers (from a `Federation` built as the config builds it, which
    trains nothing) and `PlainLoop`'s rounds of them."""
    import torch
    import yaml

    from fedlight import Federation, FederationConfig
    from fedlight.algorithms.fedavg import FedAvg
    from fedlight.models import Classifier, LeafCNN
    from made_femnist import MadeFemnist
    from plain_loop import PlainLoop

    common = ROOT / "configs/cross_device/femnist/common"
    data = MadeFemnist(**{**yaml.safe_load((common / "data.yaml").read_text())["init_args"], "root": "(made)"})
    data.load_pool()
    torch.manual_seed(0)
    federation = yaml.safe_load((common / "federation.yaml").read_text())
    config = FederationConfig(
        **{k: federation[k] for k in ("clients_per_round", "local_epochs", "batch_size")}, rounds=rounds
    )
    fed = Federation(data, Classifier(LeafCNN(num_classes=62), lr=0.1), FedAvg(), config, seed=0)
    plain = PlainLoop(fed, lambda: LeafCNN(num_classes=62), lambda p: torch.optim.SGD(p, lr=0.1))
    seconds = []
    for number in range(1, rounds + 1):
        clients = fed.algorithm.select_clients(number)
        began = time.perf_counter()
        plain.round(number, clients)
        seconds.append(time.perf_counter() - began)
    return {"round_s": seconds}


def summarize(passes: list[dict]) -> list[str]:
    """One line a pass and the medians over all passes of rounds 2 to R-1, each fedlight arm against the plain
    loop."""

    def rounds(p: dict, side: str) -> list[float]:
        if side == "plain":
            return p["plain"]["round_s"][1:-1]
        return p[side]["cycle_s"][:-1]  # cycles ending at rounds 2..R-1

    sides = [side for side in ("fedlight", "before") if side in passes[0]]
    lines = []
    for label, chosen in [*((f"pass {n}", [p]) for n, p in enumerate(passes, 1)), ("all passes", passes)]:
        plain = statistics.median([s for p in chosen for s in rounds(p, "plain")])
        parts = []
        for side in sides:
            ours = statistics.median([s for p in chosen for s in rounds(p, side)])
            reported = statistics.median([s for p in chosen for s in p[side]["time_round_s"][1:-1]])
            parts.append(f"{side} {ours:.2f} s a round (time/round_s {reported:.2f}): {ours / plain:.2f}x")
        lines.append(f"{label}: plain loop {plain:.2f} s a round; " + "; ".join(parts))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--before", type=Path, default=None, help="another checkout's fedlight as a third arm")
    parser.add_argument("--plain_one", type=int, default=None, help=argparse.SUPPRESS)  # a worker
    args = parser.parse_args()
    if args.plain_one is not None:
        print(json.dumps(run_plain(args.plain_one)))
        return
    passes = []
    sides = ["fedlight", "plain", *(["before"] if args.before else [])]
    for repeat in range(args.repeats):  # the arms take turns; which goes first rotates
        order = sides[repeat % len(sides) :] + sides[: repeat % len(sides)]
        result = {}
        for side in order:
            with tempfile.TemporaryDirectory() as folder:
                if side == "plain":
                    result[side] = plain_process(args.rounds)
                else:
                    result[side] = fedlight_process(
                        args.rounds, Path(folder), args.before if side == "before" else None
                    )
        passes.append(result)
        print(summarize([result])[0], file=sys.stderr, flush=True)
    print("\n".join(summarize(passes)))
    if args.json:
        args.json.write_text(json.dumps(passes, indent=1))


if __name__ == "__main__":
    main()
