"""PFLlib's leaderboard, ours beside theirs: every configs/papers/pfllib/ config whose data is under DATA_DIR runs as
`python -m fedlight fit --config <config> --data.init_args.root DATA_DIR --seed S` once a seed, and a markdown table
gives, per method and split, our best test accuracy over rounds (mean +- std over the seeds, in %; the std is
PFLlib's np.std, without Bessel's correction) beside the leaderboard's number quoted in the config's comment.

    python benchmarks/leaderboard.py DATA_DIR [--rounds N] [--seeds 0 1 2] [--output_dir runs/leaderboard]
        [--splits cifar100_pat ...] [--methods fedavg ...]

DATA_DIR holds torchvision's files: cifar-100-python/ (CIFAR-100) and FashionMNIST/raw/ (FMNIST, decompressed); a
config whose files are missing is skipped, and the table says so. --rounds caps the configs' 2000 rounds (a smoke
run, not the leaderboard's setting). Ours is summary.json's `test_selected/test/acc_mean`, the best round on the
test split, as PFLlib reports it (for FedBABU the better of it and the fine-tuned `test_ft/acc_mean`: PFLlib's
FedBABU number is the best of its evaluations, the fine-tuned one after the last round among them). A run whose
summary.json is already in --output_dir is read, not run again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "configs" / "papers" / "pfllib"
NUMBER = re.compile(r"(?:Leaderboard|Published) number[^:]*:\s*(not found|\d+\.\d+(?: \+- \d+\.\d+)?)")


def configs() -> list[Path]:
    """Every pfllib run config (common/ holds the shared pieces)."""
    return sorted(p for p in FOLDER.glob("*/*.yaml") if p.parent.name != "common")


def published(path: Path) -> str | None:
    """The leaderboard's number the config's leading comment quotes ("31.89 +- 0.47"), None for "not found"."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    match = NUMBER.search(" ".join(lines))
    if match is None:
        raise ValueError(f"{path}: no 'Leaderboard number: ...' in its comment")
    return None if match.group(1) == "not found" else match.group(1)


def missing_files(path: Path, data_dir: Path) -> list[Path]:
    """The files the config's data module would read under `data_dir` that are not there."""
    data = yaml.safe_load(path.read_text())["data"]
    if isinstance(data, str):
        data = yaml.safe_load((path.parent / data).read_text())
    module, name = data["class_path"].rsplit(".", 1)
    module_data = getattr(importlib.import_module(module), name)(root=str(data_dir))
    wanted = [data_dir / f for train, _ in module_data.splits() for f in module_data.files(train)]
    return [f for f in wanted if not f.is_file()]


def accuracy(summary: dict) -> float:
    """PFLlib's number from a run's summary.json: the best test accuracy over rounds, in %."""
    best = [summary[k] for k in ("test_selected/test/acc_mean", "test_ft/acc_mean") if summary.get(k) is not None]
    return 100 * max(best)


def run(path: Path, data_dir: Path, seed: int, rounds: int | None, output_dir: Path) -> float | str:
    """One seed of one config: its accuracy (%), or why there is none."""
    name = f"{path.parent.name}-{path.stem}{f'-r{rounds}' if rounds else ''}-s{seed}"
    summary = output_dir / name / "summary.json"
    if not summary.is_file():
        command = [
            sys.executable,
            "-m",
            "fedlight",
            "fit",
            "--config",
            str(path),
            "--data.init_args.root",
            str(data_dir),
            "--seed",
            str(seed),
            "--output_dir",
            str(output_dir),
            "--run_name",
            name,
        ]
        if rounds is not None:
            command += ["--federation.rounds", str(rounds)]
        output_dir.mkdir(parents=True, exist_ok=True)
        with (output_dir / f"{name}.err").open("w") as errors:
            if subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors).returncode:
                return f"failed ({output_dir / name}.err)"
    return accuracy(json.loads(summary.read_text()))


def row(path: Path, ours: str) -> str:
    theirs = published(path)
    theirs = "not found" if theirs is None else theirs.replace("+-", "±")
    return f"| {path.stem} | {path.parent.name} | {ours} | {theirs} |"


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--rounds", type=int, default=None, help="cap on the rounds (default: the configs' 2000)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--output_dir", type=Path, default=ROOT / "runs" / "leaderboard")
    parser.add_argument("--splits", nargs="+", default=None, help="e.g. cifar100_pat fmnist_dir0.1 (default: all)")
    parser.add_argument("--methods", nargs="+", default=None, help="e.g. fedavg ditto (default: all)")
    args = parser.parse_args(argv)
    data_dir = args.data_dir.resolve()
    rows = ["| method | split | ours (%) | PFLlib's published (%) |", "|---|---|---|---|"]
    for path in configs():
        if (args.splits and path.parent.name not in args.splits) or (args.methods and path.stem not in args.methods):
            continue
        missing = missing_files(path, data_dir)
        if missing:
            print(f"skipped {path.relative_to(ROOT)}: no {missing[0]}", file=sys.stderr)
            rows.append(row(path, "skipped: no data"))
            continue
        results = [run(path, data_dir, seed, args.rounds, args.output_dir) for seed in args.seeds]
        done = [r for r in results if isinstance(r, float)]
        if len(done) < len(results):
            ours = next(r for r in results if isinstance(r, str))
        else:
            ours = f"{statistics.mean(done):.2f} ± {statistics.pstdev(done):.2f}"
        rows.append(row(path, ours))
        print(rows[-1], file=sys.stderr, flush=True)
    print("\n".join(rows))
    return rows


if __name__ == "__main__":
    main()
