"""Start-up time of the commands that need no run: `list`, `--help`, `fit --help` and a config typo (on the command
line and in a file), each a fresh `python -m fedlight` process, the commands taking turns, median of `--repeats`.

    python benchmarks/startup.py [--repeats 5] [--json out.json] [--commands list "fit --help"]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commands(folder: Path) -> dict[str, list[str]]:
    typo = folder / "typo.yaml"
    typo.write_text("federation:\n  roundz: 3\n")
    quickstart = str(ROOT / "configs" / "quickstart.yaml")
    return {
        "list": ["list"],
        "--help": ["--help"],
        "fit --help": ["fit", "--help"],
        "option typo (--federaton.rounds)": ["fit", "--config", quickstart, "--federaton.rounds", "3"],
        "config key typo (federation.roundz)": ["fit", "--config", quickstart, "--config", str(typo)],
        "import lightning (reference)": None,
    }


def seconds(argv: list[str] | None) -> float:
    line = [sys.executable, "-c", "import lightning"] if argv is None else [sys.executable, "-m", "fedlight", *argv]
    started = time.perf_counter()
    subprocess.run(line, capture_output=True, cwd=ROOT)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--commands", nargs="+", default=None, help="time only these (names as in the table)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        runs = commands(Path(folder))
        runs = {name: argv for name, argv in runs.items() if args.commands is None or name in args.commands}
        times: dict[str, list[float]] = {name: [] for name in runs}
        seconds(["list"])  # a first start warms the file cache
        for _ in range(args.repeats):
            for name, argv in runs.items():
                times[name].append(seconds(argv))
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"| command | median s ({args.repeats} runs) | min s | max s |\n|---|---|---|---|")
    for name, t in times.items():
        print(f"| `{name}` | {medians[name]:.2f} | {min(t):.2f} | {max(t):.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"median_s": medians, "runs_s": times}, indent=1))


if __name__ == "__main__":
    main()
