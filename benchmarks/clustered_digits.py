"""The clustered-FL comparison on digits with 4 rotation clusters (configs/digits/*.yaml): one run per
algorithm on the same split, then a markdown table of clustering quality and client accuracy.

    python benchmarks/clustered_digits.py --output_dir /tmp/digits_rot4 [--seed 0] [--algorithms ocfl ifca]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fedlight.run.cli import main as fedlight_main

ALGORITHMS = ["fedavg", "local", "ocfl", "flis_dc", "flis_hc", "ifca", "cfl", "fesem", "flhc", "fedem", "pacfl"]


def run(algorithm: str, output_dir: Path, seed: int) -> dict:
    name = f"{algorithm}-s{seed}"
    code = fedlight_main(
        [
            "fit",
            "--config",
            f"configs/digits/{algorithm}.yaml",
            "--seed",
            str(seed),
            "--logger.wandb",
            "false",
            "--output_dir",
            str(output_dir),
            "--run_name",
            name,
        ]
    )
    if code:
        raise SystemExit(f"{algorithm} failed with exit code {code}")
    return json.loads((output_dir / name / "summary.json").read_text())


def table(summaries: dict[str, dict]) -> str:
    lines = [
        "| algorithm | ARI | clusters | clustering round | mean acc | std acc | worst acc | wall time (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for algorithm, s in summaries.items():

        def get(key: str, fmt: str = "{:.3f}") -> str:
            return fmt.format(s[key]) if key in s else "-"

        lines.append(
            f"| {algorithm} | {get('cluster/ari')} | {get('cluster/count', '{:.0f}')} | "
            f"{get('cluster/clustered_round', '{:.0f}')} | {get('test/acc_mean')} | {get('test/acc_std')} | "
            f"{get('test/acc_worst')} | {s['wall_time_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", type=Path, default=Path("runs/digits_rot4"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    args = parser.parse_args()
    summaries = {a: run(a, args.output_dir, args.seed) for a in args.algorithms}
    print(table(summaries))
    (args.output_dir / "table.md").write_text(table(summaries) + "\n")


if __name__ == "__main__":
    main()
