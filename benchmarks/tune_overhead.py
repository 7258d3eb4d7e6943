"""What tuning costs beyond its runs: `--trials` trials of `fedlight tune` against the same configurations run by
hand, one `fedlight fit` command each. The two take turns (`--repeats` times: tune, then the fits of the
parameters it drew), so a slow spell of the machine hits both alike; the table reports medians.

    python benchmarks/tune_overhead.py                                  # 8 trials of the FedProx space, 5 rounds
    python benchmarks/tune_overhead.py --trials 4 --rounds 3 --repeats 3

Every trial runs to the end (`--pruner none`) with a seeded random sampler, so each repetition draws the same
configurations; trials and fits share the trainer (`vectorize 0`) and W&B is off. Reported: the wall time of the
tune command and of the fits (each a fresh process, as by hand), the overhead of tune against them, and tune's
time outside its runs (its wall time less the runs' own wall_time_s from summary.json: start-up, Optuna's
sampling and SQLite bookkeeping).
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

import yaml

REPO = Path(__file__).resolve().parent.parent


def command(*args: str) -> float:
    """Run `python -m fedlight ARGS` and return its wall time in seconds."""
    env = {**os.environ, "WANDB_MODE": "offline", "JSONARGPARSE_DEPRECATION_WARNINGS": "off"}
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fedlight", *args], check=True, env=env, capture_output=True, text=True, cwd=REPO
    )
    return time.perf_counter() - started


def common(args: argparse.Namespace) -> list[str]:
    return [
        "--config",
        args.config,
        "--federation.rounds",
        str(args.rounds),
        "--federation.vectorize",
        "0",
        "--logger.wandb",
        "false",
    ]


def repetition(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    """One tune of `--trials` trials, then the same configurations by hand; wall times in seconds."""
    tune_s = command(
        "tune",
        *common(args),
        "--space",
        args.space,
        "--trials",
        str(args.trials),
        "--study",
        "bench",
        "--output_dir",
        str(folder / "tune"),
        "--pruner",
        "none",
        "--sampler",
        "random",
        "--sampler_seed",
        "0",
    )
    trials = sorted((folder / "tune" / "tune-bench").glob("trial-*"))
    runs_s = sum(json.loads((t / "summary.json").read_text())["wall_time_s"] for t in trials)
    space = yaml.safe_load((REPO / args.space).read_text())
    fixed = [
        f"--{key}={value if isinstance(value, str) else json.dumps(value)}"
        for key, value in (space.get("fixed") or {}).items()
    ]
    fit_s = 0.0
    for trial in trials:  # the configuration the trial ran, as one would type it
        config = yaml.safe_load((trial / "config.yaml").read_text())
        values = [
            f"--{key}={json.dumps(lookup(config, key))}" for key in space["params"] if lookup(config, key) is not None
        ]
        fit_s += command(
            "fit",
            *common(args),
            *fixed,
            *values,
            "--federation.eval_split",
            "val",
            "--output_dir",
            str(folder / "fit"),
            "--run_name",
            trial.name,
        )
    return {"tune_s": tune_s, "fit_s": fit_s, "tune_outside_runs_s": tune_s - runs_s}


def lookup(config: dict, key: str) -> object:
    """The value of a dotted key in a resolved config (`model.init_args.lr`); None where the trial's choices left
    the key out (a parameter with `when`)."""
    value: object = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--space", default="configs/tune/fedprox.yaml")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=str, default=None, help="also write the result here")
    args = parser.parse_args()
    rows = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            rows.append(repetition(args, Path(folder)))
    result = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
    result.update(
        trials=args.trials, rounds=args.rounds, repeats=args.repeats, overhead=result["tune_s"] / result["fit_s"] - 1
    )
    print("| trials | rounds | tune s | fits by hand s | tune vs by hand | tune outside its runs s |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {args.trials} | {args.rounds} | {result['tune_s']:.1f} | {result['fit_s']:.1f} | "
        f"{100 * result['overhead']:+.0f}% | {result['tune_outside_runs_s']:.1f} |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
