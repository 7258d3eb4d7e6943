"""Robust aggregation and client-level DP on digits: the two tables of docs/guides/robust_private.md.

    python benchmarks/robust_digits.py --output_dir runs/robust            # both grids, 3 seeds, then the tables
    python benchmarks/robust_digits.py --output_dir runs/robust --tables   # the tables only, from the run folders
    python benchmarks/robust_digits.py --output_dir /tmp/robust-check --sample   # one 2-round run of each grid
    python benchmarks/robust_digits.py --output_dir runs/robust --grid private     # one grid (144 and 36 runs)

Grid 1 (robust): FedAvg and OCFL on the quickstart (digits, 20 clients in 4 rotation clusters, SmallCNN, 10 rounds),
with every `aggregator.rule`, clean and with 20 % sign-flip or label-flip attackers (f = 4 for Krum, Multi-Krum
and Bulyan, beta = 0.2 for the trimmed mean, clip 0.5 for the clipped mean: about the median update norm of round 1).
Grid 2 (private): FedAvg, OCFL-KM (k = 4) and IFCA (k = 4) on digits with 40 clients in 4 rotation clusters and logistic
regression (650 parameters: client-level DP needs many clients per parameter), every client every round, clip 0.3
(about the median update norm), `privacy.target_epsilon` 1, 4 and 8 at delta 1e-5 after 10 rounds, and no DP.

Grid 3 (splits): FedAvg with every rule on the IID digits (`configs/digits/iid/fedavg.yaml`) and on its label skew
(2 classes a client, `configs/digits/skew/fedavg.yaml`), clean and with 20 % ten-fold sign flippers, 15 rounds, and
60 rounds of the IID runs under attack: mean ± the 95 % t half-width over 3 seeds and each rule's paired difference
to the clean mean of its split (`python benchmarks/robust_digits.py --grid splits`).

Each grid is a `fedlight sweep` (its file is written into the output folder): finished runs are skipped and
unfinished ones resumed, so rerunning the command completes an interrupted grid; each grid ends with its HTML report.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml

from fedlight.reports.intervals import mean_interval, paired_difference
from fedlight.run import sweep
from fedlight.run.cli import main as fedlight_main

REPO = Path(__file__).resolve().parents[1]
SEEDS = [0, 1, 2]
AGGREGATORS = ["mean", "median", "trimmed_mean", "krum", "multikrum", "bulyan", "geomed", "clipped_mean"]
ATTACKS = {
    "clean": {},
    "sign_flip": {"attack.kind": "sign_flip", "attack.fraction": 0.2},
    "label_flip": {"attack.kind": "label_flip", "attack.fraction": 0.2},
}
ROBUST_ALGORITHMS = {"fedavg": "fedavg", "ocfl": "ocfl"}
ROBUST_SETTINGS = {
    "federation.rounds": 10,
    "aggregator.f": 4,
    "aggregator.beta": 0.2,
    "aggregator.clip": 0.5,
    "logger.wandb": False,
}
EPSILONS = [1, 4, 8, None]
#: OCFL-KM (the OCFL paper's k-means variant, k = 4 known): with logistic regression's updates HDBSCAN at its default
#: minimum cluster size finds one cluster even without DP, which would leave nothing for the noise to degrade
OCFL_KM = {"class_path": "fedlight.cluster.KMeans", "init_args": {"n_clusters": 4}}
PRIVATE_ALGORITHMS = {
    "fedavg": {"class_path": "fedavg"},
    "ocfl": {"class_path": "ocfl", "init_args": {"clusterer": OCFL_KM}},
    "ifca": {"class_path": "ifca", "init_args": {"num_clusters": 4}},
}
PRIVATE_SETTINGS = {
    "federation.rounds": 10,
    "data.init_args.num_clients": 40,
    "logger.wandb": False,
    "model.init_args.network": {
        "class_path": "fedlight.models.MLP",
        "init_args": {"input_dim": 64, "hidden": [], "num_classes": 10},
    },
}
PRIVACY = {"privacy.clip": 0.3, "privacy.delta": 1e-5}
SPLITS = {
    "iid": {},
    "skew": {
        "data.init_args.partition": {
            "class_path": "fedlight.datamodules.ClassesPerClient",
            "init_args": {"classes_per_client": 2},
        }
    },
}
SPLIT_ATTACKS = {"clean": {}, "sign_flip": ATTACKS["sign_flip"]}
SPLIT_SETTINGS = {**ROBUST_SETTINGS, "federation.rounds": 15}
LONG_ROUNDS = 60
#: the rules run again over buckets of 2 updates (Karimireddy, He, Jaggi, ICLR 2022): 10 buckets a round, at most
#: 4 of them spoiled by the 4 attackers; the trimmed mean then trims 4 of 10 a side (beta 0.4)
BUCKETED = {"median": {}, "trimmed_mean": {"aggregator.beta": 0.4}, "geomed": {}}
IID_BASE = "digits/iid/fedavg.yaml"


def robust_grid() -> list[dict]:
    return [
        {
            "class_path": algorithm,
            "name": f"{name}-{aggregator}-{attack}",
            "overrides": {"aggregator.rule": aggregator, **extra},
        }
        for name, algorithm in ROBUST_ALGORITHMS.items()
        for aggregator in AGGREGATORS
        for attack, extra in ATTACKS.items()
    ]


def private_grid() -> list[dict]:
    return [
        {
            **spec,
            "name": f"{name}-eps{epsilon or 'none'}",
            "overrides": {} if epsilon is None else {**PRIVACY, "privacy.target_epsilon": epsilon},
        }
        for name, spec in PRIVATE_ALGORITHMS.items()
        for epsilon in EPSILONS
    ]


def splits_grid() -> list[dict]:
    """FedAvg with every rule, clean and under sign flips, on both splits (15 rounds), and the IID attacked runs
    again for `LONG_ROUNDS` rounds: does a longer run close a rule's gap?"""
    entries = [
        {
            "class_path": "fedavg",
            "name": f"{split}-{aggregator}-{attack}",
            "overrides": {"aggregator.rule": aggregator, **extra, **partition},
        }
        for split, partition in SPLITS.items()
        for aggregator in AGGREGATORS
        for attack, extra in SPLIT_ATTACKS.items()
        if not diverges(aggregator, attack)
    ]
    entries += [
        {
            "class_path": "fedavg",
            "name": f"{split}-{aggregator}_b2-{attack}",
            "overrides": {"aggregator.rule": aggregator, "aggregator.bucket": 2, **settings, **extra, **partition},
        }
        for split, partition in SPLITS.items()
        for aggregator, settings in BUCKETED.items()
        for attack, extra in SPLIT_ATTACKS.items()
    ]
    return entries + [
        {
            "class_path": "fedavg",
            "name": f"iid{LONG_ROUNDS}-{aggregator}-{attack}",
            "overrides": {"aggregator.rule": aggregator, "federation.rounds": LONG_ROUNDS, **extra},
        }
        for aggregator in AGGREGATORS
        for attack, extra in SPLIT_ATTACKS.items()
        if not diverges(aggregator, attack)
    ]


def diverges(aggregator: str, attack: str) -> bool:
    """The plain mean under ten-fold sign flips: its loss overflows within 10 rounds and the run stops, naming the
    attack (left out of the grid; its cell says so)."""
    return aggregator == "mean" and attack != "clean"


def run_grid(
    folder: Path, entries: list[dict], overrides: dict, seeds: list[int], title: str, base: str = "quickstart.yaml"
) -> None:
    """Write the grid as a sweep file in `folder` and run it (finished runs skipped, unfinished ones resumed)."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {
        "base": str(REPO / "configs" / base),
        "output_dir": str(folder),
        "algorithms": entries,
        "seeds": seeds,
        "overrides": overrides,
        "title": title,
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    sweep.run(path, fedlight_main)


def final(folder: Path, name: str, key: str) -> list[float]:
    """`key` of every seed's summary.json of one grid entry (the last evaluated round)."""
    return list(seeds_of(folder, name, key).values())


def cell(values: list[float]) -> str:
    """mean ± std over the seeds ('-' when no run has the value)."""
    if not values:
        return "-"
    spread = statistics.pstdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {spread:.3f}"


def robust_tables(folder: Path) -> str:
    head = "| aggregator | " + " | ".join(f"{a} {k}" for a in ("FedAvg", "OCFL") for k in ATTACKS) + " |"
    lines = [
        "Mean test accuracy over clients after 10 rounds (mean ± std over 3 seeds):",
        "",
        head,
        "|---" * (1 + 2 * len(ATTACKS)) + "|",
    ]
    for aggregator in AGGREGATORS:
        cells = [
            cell(final(folder, f"{a}-{aggregator}-{k}", "test/acc_mean")) for a in ROBUST_ALGORITHMS for k in ATTACKS
        ]
        lines.append(f"| {aggregator} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "OCFL's clustering: ARI against the rotations, and against the rotations with the attackers as a "
        "fifth cluster:",
        "",
        "| aggregator | clean ARI | sign_flip ARI (attackers) | label_flip ARI (attackers) |",
        "|---|---|---|---|",
    ]
    for aggregator in AGGREGATORS:
        cells = [cell(final(folder, f"ocfl-{aggregator}-clean", "cluster/ari"))]
        cells += [
            f"{cell(final(folder, f'ocfl-{aggregator}-{k}', 'cluster/ari'))} "
            f"({cell(final(folder, f'ocfl-{aggregator}-{k}', 'cluster/ari_attackers'))})"
            for k in ("sign_flip", "label_flip")
        ]
        lines.append(f"| {aggregator} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def splits_table(folder: Path) -> str:
    """Each rule's final mean accuracy on both splits, clean and under sign flips, as mean ± the 95 % t half-width
    over seeds, and under attack its paired difference to the clean mean of its split (* the interval excludes 0)."""
    columns = [(split, attack) for split in (*SPLITS, f"iid{LONG_ROUNDS}") for attack in SPLIT_ATTACKS]
    head = " | ".join(f"{split} {attack}" for split, attack in columns)
    lines = [
        "FedAvg's mean test accuracy over clients with each rule (15 rounds; iid60: 60 rounds; _b2: over buckets of "
        "2 updates), mean ± 95 % t half-width over 3 seeds; under attack, in parentheses, the paired difference to "
        "the clean mean of its split:",
        "",
        f"| aggregator | {head} |",
        "|---" * (1 + len(columns)) + "|",
    ]
    for aggregator in [*AGGREGATORS, *(f"{rule}_b2" for rule in BUCKETED)]:
        cells = []
        for split, attack in columns:
            if diverges(aggregator, attack):
                cells.append("diverges")
                continue
            mine = seeds_of(folder, f"{split}-{aggregator}-{attack}")
            text = mean_interval(list(mine.values())).text() if mine else "-"
            clean = seeds_of(folder, f"{split}-mean-clean")
            if attack != "clean" and len(set(mine) & set(clean)) >= 2:
                difference = paired_difference(mine, clean)
                text += f" ({difference.text()}{' *' if difference.excludes_zero() else ''})"
            cells.append(text)
        lines.append(f"| {aggregator} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seeds_of(folder: Path, name: str, key: str = "test/acc_mean") -> dict[int, float]:
    """seed -> `key` of the grid entry's run of that seed."""
    values = {}
    for summary in sorted(folder.glob(f"{name}-s*/summary.json")):
        found = json.loads(summary.read_text()).get(key)
        if found is not None:
            values[int(summary.parent.name.rsplit("-s", 1)[1])] = float(found)
    return values


def private_table(folder: Path) -> str:
    lines = [
        "Mean test accuracy and ARI after 10 rounds against epsilon (delta 1e-5; mean ± std over 3 seeds):",
        "",
        "| epsilon | noise multiplier | FedAvg acc | OCFL acc | OCFL ARI | IFCA acc | IFCA ARI |",
        "|---|---|---|---|---|---|---|",
    ]
    for epsilon in EPSILONS:
        tag = epsilon or "none"
        noise = [
            z for name in PRIVATE_ALGORITHMS for z in final(folder, f"{name}-eps{tag}", "privacy/noise_multiplier")
        ]
        cells = [f"{noise[0]:.2f}" if noise else "-", cell(final(folder, f"fedavg-eps{tag}", "test/acc_mean"))]
        for name in ("ocfl", "ifca"):
            cells += [cell(final(folder, f"{name}-eps{tag}", key)) for key in ("test/acc_mean", "cluster/ari")]
        lines.append(f"| {tag} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output_dir", type=Path, default=Path("runs/robust"))
    parser.add_argument("--tables", action="store_true", help="only print the tables of the runs already there")
    parser.add_argument("--sample", action="store_true", help="one 2-round run of each grid, to check the pipeline")
    parser.add_argument(
        "--grid",
        choices=("robust", "private", "both", "splits"),
        default="both",
        help="run one grid only (two commands can then share the machine's cores)",
    )
    args = parser.parse_args()
    robust, private = args.output_dir / "robust", args.output_dir / "private"
    if args.grid == "splits":
        folder = args.output_dir / "splits"
        if not args.tables:
            settings = {**SPLIT_SETTINGS, **({"federation.rounds": 2} if args.sample else {})}
            entries = splits_grid()[:1] if args.sample else splits_grid()
            run_grid(folder, entries, settings, [0] if args.sample else SEEDS, "Robust rules, IID and skew", IID_BASE)
        text = splits_table(folder) + "\n"
        print(text)
        (args.output_dir / "splits.md").write_text(text)
        return
    if args.sample:
        run_grid(
            robust,
            [e for e in robust_grid() if e["name"] == "ocfl-krum-sign_flip"],
            {**ROBUST_SETTINGS, "federation.rounds": 2},
            [0],
            "sample",
        )
        run_grid(
            private,
            [e for e in private_grid() if e["name"] == "ifca-eps4"],
            {**PRIVATE_SETTINGS, "federation.rounds": 2},
            [0],
            "sample",
        )
    elif not args.tables:
        if args.grid in ("robust", "both"):
            run_grid(robust, robust_grid(), ROBUST_SETTINGS, SEEDS, "Robust aggregation on digits under attack")
        if args.grid in ("private", "both"):
            run_grid(private, private_grid(), PRIVATE_SETTINGS, SEEDS, "Client-level DP on digits")
    text = robust_tables(robust) + "\n\n" + private_table(private) + "\n"
    print(text)
    (args.output_dir / "tables.md").write_text(text)


if __name__ == "__main__":
    main()
