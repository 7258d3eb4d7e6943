"""p-FClus, k-FED, MFC and CentClus on the synthetic sets, several seeds: the table of the p-FClus note (p-FClus:
"Fair Federated Data Clustering through Personalization: Bridging the Gap between Diverse Data Distributions").

Every run goes through the ordinary CLI (`fedlight fit --config configs/papers/pfclus/syn_o_h2_<method>.yaml`
with the data set, H and seed overridden), so it has its run folder, metrics.csv and summary.json; this script
only runs them in one process and tabulates the summaries: per method, the mean and standard deviation over
seeds of the clients' mean cost (mu), the population standard deviation across clients (sigma) and the worst
client's cost (max), all in the paper's convention (unsquared Euclidean distance, `train/cost_p1_*`), beside
a reference run of the authors' released code's logic (numpy + scikit-learn, seed 0; not in the paper).

    python benchmarks/pfclus_table.py                       # NO / LO / O x H in {2, 10} x seeds {0, 300, ..., 1200}
    python benchmarks/pfclus_table.py --sets O --heterogeneity 2 --seeds 0
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from pathlib import Path

import numpy as np

from fedlight.run.cli import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "papers" / "pfclus"
METHODS = ("pfclus", "kfed", "mfc", "centclus")
# Reference run of the authors' released logic: mu / sigma / max (Z = 100 balanced, 100 points per client, seed 0)
REFERENCE = {
    ("NO", 2): {
        "p-FClus": (1.245, 0.067, 1.408),
        "p-FClus global": (1.259, 0.066, 1.438),
        "k-FED": (6.790, 2.993, 14.26),
        "MFC": (1.258, 0.066, 1.427),
        "CentClus": (1.258, 0.067, 1.431),
        "local k-means": (0.596, None, None),
    },
    ("NO", 10): {
        "p-FClus": (1.191, 0.064, 1.350),
        "p-FClus global": (1.258, 0.067, 1.426),
        "k-FED": (1.261, 0.067, 1.426),
        "MFC": (1.272, 0.069, 1.461),
        "CentClus": (1.258, 0.067, 1.426),
        "local k-means": (1.191, None, None),
    },
    ("LO", 2): {
        "p-FClus": (2.480, 0.132, 2.817),
        "p-FClus global": (2.518, 0.133, 2.879),
        "k-FED": (11.23, 5.92, 24.49),
        "MFC": (2.516, 0.133, 2.855),
        "CentClus": (2.515, 0.133, 2.863),
        "local k-means": (1.192, None, None),
    },
    ("O", 2): {
        "p-FClus": (3.316, 0.287, 4.193),
        "p-FClus global": (3.751, 0.192, 4.267),
        "k-FED": (13.98, 6.80, 32.40),
        "MFC": (3.749, 0.191, 4.261),
        "CentClus": (3.747, 0.192, 4.246),
        "local k-means": (1.785, None, None),
    },
    ("O", 10): {
        "p-FClus": (3.542, 0.188, 4.004),
        "p-FClus global": (3.746, 0.195, 4.223),
        "k-FED": (4.393, 0.223, 4.923),
        "MFC": (3.784, 0.198, 4.344),
        "CentClus": (3.745, 0.195, 4.222),
        "local k-means": (3.536, None, None),
    },
}
ROWS = (
    ("p-FClus", "pfclus", "train"),
    ("p-FClus global", "pfclus", "global"),
    ("local k-means", "pfclus", "local"),
    ("k-FED", "kfed", "train"),
    ("MFC", "mfc", "train"),
    ("CentClus", "centclus", "train"),
)


def run_one(out: Path, overlap: str, h: int, method: str, seed: int, args: argparse.Namespace) -> dict:
    name = f"{overlap.lower()}_h{h}_{method}_s{seed}"
    summary = out / name / "summary.json"
    if not summary.is_file():
        argv = [
            "fit",
            "--config",
            str(CONFIGS / f"syn_o_h2_{method}.yaml"),
            "--seed",
            str(seed),
            "--data.init_args.overlap",
            overlap,
            "--data.init_args.heterogeneity",
            str(h),
            "--data.init_args.num_clients",
            str(args.clients),
            "--data.init_args.points_per_client",
            str(args.points),
            "--data.init_args.size_step",
            str(args.step),
            "--federation.accelerator",
            args.accelerator,
            "--output_dir",
            str(out),
            "--run_name",
            name,
            "--logger.wandb",
            "false",
        ]
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        if code != 0:
            raise RuntimeError(f"run {name} failed ({code})")
    return json.loads(summary.read_text())


def triple(summary: dict, prefix: str) -> tuple[float, float, float]:
    return tuple(summary[f"{prefix}/cost_p1_{s}"] for s in ("mean", "std", "worst"))


def cell(values: list[float]) -> str:
    return f"{np.mean(values):.3f} ± {np.std(values):.3f}"


def ref_cell(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def main_table(args: argparse.Namespace) -> str:
    out = Path(args.out)
    lines = [
        f"Z = {args.clients} clients, {args.points} points (+{args.step} per client), k = 10, l = 2; "
        f"seeds {args.seeds}; costs are per-point unsquared Euclidean (train/cost_p1_*); "
        "ours = mean ± std over seeds, ref = reference run of the released logic (seed 0).",
        "",
    ]
    checks = []
    for overlap in args.sets:
        for h in args.heterogeneity:
            started = time.perf_counter()
            runs = {m: [run_one(out, overlap, h, m, s, args) for s in args.seeds] for m in METHODS}
            ref = REFERENCE.get((overlap, h), {})
            lines += [
                f"### Syn-{overlap}, H = {h}  ({time.perf_counter() - started:.0f} s)",
                "",
                "| method | mu (ours) | sigma (ours) | max (ours) | point ARI (ours) | mu / sigma / max (ref) |",
                "|---|---|---|---|---|---|",
            ]
            for label, method, prefix in ROWS:
                values = [triple(s, prefix) for s in runs[method]]
                ari = cell([s["cluster/point_ari"] for s in runs[method]]) if prefix == "train" else ""
                reference = " / ".join(ref_cell(v) for v in ref.get(label, (None,) * 3) if v is not None)
                lines.append(
                    f"| {label} | {cell([v[0] for v in values])} | {cell([v[1] for v in values])} | "
                    f"{cell([v[2] for v in values])} | {ari} | {reference} |"
                )
            lines.append("")
            for i, seed in enumerate(args.seeds):
                p, k, m = (triple(runs[x][i], "train") for x in ("pfclus", "kfed", "mfc"))
                g = triple(runs["pfclus"][i], "global")
                checks.append(
                    (
                        overlap,
                        h,
                        seed,
                        p[0] < min(k[0], m[0]),
                        p[2] < min(k[2], m[2]),
                        p[0] < g[0],
                        p[1] < k[1],
                        p[1] < m[1],
                    )
                )
    lines += [
        "### p-FClus against the baselines, seed by seed",
        "",
        "| set | H | seeds with mu < k-FED, MFC | max < k-FED, MFC | mu < own global | sigma < k-FED | sigma < MFC |",
        "|---|---|---|---|---|---|---|",
    ]
    for overlap in args.sets:
        for h in args.heterogeneity:
            rows = [c for c in checks if c[0] == overlap and c[1] == h]
            counts = [sum(r[j] for r in rows) for j in range(3, 8)]
            lines.append(f"| Syn-{overlap} | {h} | " + " | ".join(f"{c}/{len(rows)}" for c in counts) + " |")
    return "\n".join(lines)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["NO", "LO", "O"], choices=["NO", "LO", "O"])
    parser.add_argument("--heterogeneity", nargs="+", type=int, default=[2, 10])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 300, 600, 900, 1200])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--points", type=int, default=100)
    parser.add_argument("--step", type=int, default=0, help="size increase per client (0: balanced)")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--out", default="/tmp/pfclus_table", help="folder of the run folders (reused)")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    table = main_table(arguments)
    print(table)
    Path(arguments.out).mkdir(parents=True, exist_ok=True)
    (Path(arguments.out) / "table.md").write_text(table + "\n")
