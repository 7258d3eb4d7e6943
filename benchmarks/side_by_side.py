"""Runs side by side: one quickstart run alone, then two and three started together, each a fresh
`python -m fedlight fit` process, with OpenMP's wait policy as fedlight sets it (passive: idle threads sleep) and as
torch leaves it (libgomp's default: idle threads spin for a while first). Every run uses the default thread count
(the usable cores), as a user's does. The two policies and the three counts take turns in every repetition, and each
arm's fastest repetition is kept.

    python benchmarks/side_by_side.py [--rounds 6] [--repeats 2] [--config configs/quickstart.yaml]

"Torch's policy" starts the same command with torch imported before fedlight (`python -c "import torch; ..."`), so
the policy fedlight sets reaches only the processes it starts, as before fedlight set it. Reported: the wall time of
the last run to finish in each arm, and the ratio to one run alone under the same policy (targets: at most 2.6x for
two and 3.8x for three), and passive alone against spinning alone (target: no slower by more than 5 %). Nothing else
may run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: how each policy starts fedlight's command line: through its entry point, or after torch loaded first
LAUNCHERS = {
    "passive (fedlight's)": ["-m", "fedlight"],
    "spinning (torch's)": [
        "-c",
        "import sys, runpy, torch; sys.argv[0] = 'fedlight'; runpy.run_module('fedlight', run_name='__main__')",
    ],
}


def together(count: int, launcher: list[str], config: Path, rounds: int, folder: Path, tag: str) -> float:
    """Start `count` runs at once; seconds until the last one ends."""
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    env.update(WANDB_MODE="offline", FEDLIGHT_CACHE_DIR=str(folder / "cache"))
    start = time.perf_counter()
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                *launcher,
                "fit",
                "--config",
                str(config),
                "--federation.rounds",
                str(rounds),
                "--logger.wandb",
                "false",
                "--output_dir",
                str(folder),
                "--run_name",
                f"{tag}-{i}",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    for process in processes:
        _, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"a run failed: {err[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs/quickstart.yaml")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    best: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for count in args.counts:
                for policy, launcher in LAUNCHERS.items():  # the policies take turns
                    tag = f"{policy.split()[0]}-{count}-r{repeat}"
                    seconds = together(count, launcher, args.config.resolve(), args.rounds, Path(tmp), tag)
                    best[policy, count] = min(best.get((policy, count), float("inf")), seconds)
                    print(f"  {policy}, {count} together, repetition {repeat + 1}: {seconds:.1f} s", flush=True)
    print(f"\n{args.config.name}, {args.rounds} rounds, default threads, fastest of {args.repeats}\n")
    print("| policy | " + " | ".join(f"{c} together s | vs alone" for c in args.counts) + " |")
    print("|---|" + "---|---|" * len(args.counts))
    for policy in LAUNCHERS:
        alone = best[policy, args.counts[0]]
        cells = [f"{best[policy, c]:.1f} | {best[policy, c] / alone:.2f}x" for c in args.counts]
        print(f"| {policy} | " + " | ".join(cells) + " |")
    passive, spinning = (best[p, args.counts[0]] for p in LAUNCHERS)
    print(f"\none run alone, passive against spinning: {passive / spinning:.3f}x")


if __name__ == "__main__":
    main()
