"""Round time of the personalized methods against FedAvg's on configs/digits/skew, in this checkout and, side by
side, in another one (an older commit, to measure a change): every method's config end to end in a fresh
`python -m fedlight fit` process under `vectorize: -1` (auto), the two checkouts taking turns per method and
repetition; each method's fastest repetition is kept. Reported: seconds per round, the ratio to FedAvg's in the same
checkout, and the trainer the plan printed.

    python benchmarks/personalized_speed.py [--before /path/to/old/checkout] [--rounds 10] [--repeats 2]

FedEM has no skew config: it runs configs/digits/skew/fedavg.yaml with `--algorithm fedem`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from shipped_configs import ROOT, fastest, run

METHODS = ["fedavg", "ditto", "fedrep", "fedem", "apfl", "pfedme", "perfedavg"]


def config_of(method: str) -> tuple[Path, tuple[str, ...]]:
    """The skew config of a method, and the options that pick it (FedEM: FedAvg's config, another algorithm)."""
    if method == "fedem":
        return ROOT / "configs/digits/skew/fedavg.yaml", ("--algorithm", "fedem")
    return ROOT / f"configs/digits/skew/{method}.yaml", ()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, default=None, help="another checkout, with its own .venv, to compare")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=METHODS)
    args = parser.parse_args()
    sides = {"after": (ROOT, str(ROOT / ".venv/bin/python"))}
    if args.before is not None:
        sides = {"before": (args.before.resolve(), str(args.before.resolve() / ".venv/bin/python")), **sides}
    rows: dict[str, dict[str, dict]] = {side: {} for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            config, extra = config_of(method)
            runs: dict[str, list[dict]] = {side: [] for side in sides}
            for repeat in range(args.repeats):
                for side, (checkout, python) in sides.items():  # the checkouts take turns
                    runs[side].append(
                        run(
                            checkout / config.relative_to(ROOT),
                            "-1",
                            args.rounds,
                            Path(tmp),
                            extra,
                            repeat=repeat,
                            name=f"{side}-{method}",
                            checkout=checkout,
                            python=python,
                        )
                    )
            for side in sides:
                rows[side][method] = fastest(runs[side])
    print("| method | " + " | ".join(f"{side} s/round | {side} vs FedAvg | {side} trainer" for side in sides) + " |")
    print("|---|" + "---|---|---|" * len(sides))
    for method in args.methods:
        cells = []
        for side in sides:
            row, base = rows[side][method], rows[side].get("fedavg", {})
            if "s_per_round" not in row:
                cells += [row.get("error", "?")[:50], "-", "-"]
                continue
            ratio = f"{row['s_per_round'] / base['s_per_round']:.2f}x" if "s_per_round" in base else "-"
            plan = row["summary"].get("plan", {})
            cells += [f"{row['s_per_round']:.3f}", ratio, plan.get("trainer", "?")]
        print(f"| {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
