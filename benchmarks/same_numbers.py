"""Every algorithm's numbers, recorded before a change and compared after it: a refactor must not change any.

    python benchmarks/same_numbers.py record OUT [--only NAME ...]   # one run folder per name under OUT/<name>/
    python benchmarks/same_numbers.py compare BEFORE AFTER           # one line per run; exit 1 when any differs

`record` runs every algorithm for 3 rounds, one fresh `python -m fedlight fit` process after another, with
`federation.vectorize 0` and `federation.threads 1` so that no number depends on the machine's load: each shipped
digits config (configs/digits/, its skew/ and iid/), a config of its own for the algorithms without one (FedProx,
FedBN on a BatchNorm network, the centroid family on the p-FClus paper's small synthetic split), FedAvg, Ditto,
FedPer and SCAFFOLD with `vectorize 4` (Ditto still trains one client at a time: it trains its clients itself),
and one run each with newcomers, an attack and client-level privacy. Run it with
`OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1` before and after the change.

`compare` reads metrics.csv, clients.csv and matrices/*.npy of every run, bit for bit (CSV cells as written, arrays
as bytes), leaving out the timing columns (`time/round_s` and any other named after time or seconds).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shipped_configs import ROOT, configs_under, run

ROUNDS = 3
CONFIGS = ROOT / "configs"
DIGITS = CONFIGS / "digits"
ROTATIONS = DIGITS / "fedavg.yaml"  # digits in 4 rotation clusters, 20 clients
CENTROIDS = CONFIGS / "papers" / "pfclus"  # 100 clients x 100 points of 2-d Gaussians
PRETRAINED = CONFIGS / "pretrained"
#: the tiny random ViT the adapter methods' recordings fine-tune (made by `record` when missing; seeded, so the same)
TINY_VIT = Path(tempfile.gettempdir()) / "fedlight-same-numbers-tiny-vit"
#: settings that bring a shipped config's clustering within the 3 rounds (its own waits 5; CFL's updates are
#: still small in round 2, with a largest norm of about 0.8 under its eps2 of 1)
WITHIN_ROUNDS = {
    "digits_cfl": (
        "--algorithm.init_args.warmup_rounds",
        "1",
        "--algorithm.init_args.split_cooldown",
        "1",
        "--algorithm.init_args.eps2",
        "0.6",
    ),
    "digits_flhc": ("--algorithm.init_args.cluster_round", "2"),
}
#: the compared files of a run folder
RECORDS = ("metrics.csv", "clients.csv", "matrices/*.npy")
TIMING = re.compile(r"time|seconds|_s$|_ms$", re.IGNORECASE)


@dataclass(frozen=True)
class Recording:
    """One recorded run: its folder's name, config, the options after it, and `federation.vectorize`."""

    name: str
    config: Path
    options: tuple[str, ...] = ()
    vectorize: str = "0"
    rounds: int = ROUNDS
    env: dict[str, str] = field(default_factory=dict)


def recordings() -> list[Recording]:
    """Every algorithm of the project (each shipped digits config), some twice, and the vectorized, newcomer, attack
    and privacy runs."""
    shipped = []
    for config in configs_under([DIGITS]):
        name = config.relative_to(CONFIGS).with_suffix("").as_posix().replace("/", "_")
        shipped.append(Recording(name, config, WITHIN_ROUNDS.get(name, ())))
    batch_norm = {"PYTHONPATH": str(ROOT / "tests")}  # the tests' Lightning module: BatchNorm and a StepLR schedule
    own = [
        Recording("fedprox", ROTATIONS, ("--algorithm", "fedprox", "--algorithm.init_args.mu", "0.1")),
        Recording(
            "fedbn",
            ROTATIONS,
            ("--algorithm", "fedbn", "--model", "helpers.ordinary_module.OrdinaryModule"),
            env=batch_norm,
        ),
        *[Recording(name, CENTROIDS / f"syn_o_h2_{name}.yaml", rounds=1) for name in ("pfclus", "kfed", "centclus")],
        Recording("mfc", CENTROIDS / "syn_o_h2_mfc.yaml"),
        Recording("fedavg-vec4", ROTATIONS, vectorize="4"),
        Recording(
            "ditto-vec4", DIGITS / "skew" / "ditto.yaml", vectorize="4"
        ),  # vectorized group work (dropout: masks per group)
        Recording("fedper-vec4", DIGITS / "skew" / "fedper.yaml", vectorize="4"),  # personal layers, vectorized
        Recording("scaffold-vec4", DIGITS / "skew" / "scaffold.yaml", vectorize="4"),  # a gradient correction
        Recording("fedrep-vec4", DIGITS / "skew" / "fedrep.yaml", vectorize="4"),  # frozen parts, vectorized
        Recording("ifca-newcomers", DIGITS / "ifca.yaml", ("--data.init_args.holdout_clients", "0.2")),
        Recording("ocfl-backdoor", DIGITS / "ocfl.yaml", ("--attack.kind", "backdoor", "--attack.fraction", "0.2")),
        Recording("fedavg-privacy", ROTATIONS, ("--privacy.noise_multiplier", "1.0", "--privacy.clip", "1.0")),
        *[
            Recording(f"{path.stem.removeprefix('image_')}-adapters", path, ("--model.init_args.path", str(TINY_VIT)))
            for path in sorted(PRETRAINED.glob("image_*.yaml"))
        ],  # LoRA adapters of a frozen base
    ]
    return shipped + own


def record(out: Path, only: list[str] | None = None) -> int:
    """Run the recordings (those named in `only`, or all) into `out`; 1 when any failed."""
    chosen = [r for r in recordings() if not only or r.name in only]
    unknown = set(only or ()) - {r.name for r in chosen}
    if unknown:
        raise SystemExit(f"unknown run names {sorted(unknown)}: choose among {[r.name for r in recordings()]}")
    out.mkdir(parents=True, exist_ok=True)
    if any(str(TINY_VIT) in r.options for r in chosen) and not (TINY_VIT / "config.json").is_file():
        from fedlight.models.tiny_pretrained import make_tiny

        make_tiny("vit", TINY_VIT, num_classes=10)
    failed = 0
    for r in chosen:
        env = {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", **r.env}
        result = run(
            r.config, r.vectorize, r.rounds, out, ("--federation.threads", "1", *r.options), env=env, name=r.name
        )
        failed += "error" in result
        print(f"{r.name}: {result.get('error', 'recorded')} ({result['wall_s']:.0f} s)", flush=True)
    return int(failed > 0)


def is_timing(column: str) -> bool:
    """A column that measures time, which differs from run to run."""
    return bool(TIMING.search(column))


def differing_csv(a: Path, b: Path) -> str | None:
    """The first cell (outside the timing columns) where two CSV files differ, with the largest absolute
    difference of their numeric cells; None when they are the same. Columns only the second file has (a value
    logged since) are not compared: every value of the first must be in the second, unchanged."""
    (columns_a, rows_a), (columns_b, rows_b) = read_csv(a), read_csv(b)
    if not set(columns_a) <= set(columns_b):  # a column gone is a difference; one added changes no number
        return (
            f"columns differ: only before {sorted(set(columns_a) - set(columns_b))}, "
            f"only after {sorted(set(columns_b) - set(columns_a))}"
        )
    if len(rows_a) != len(rows_b):
        return f"{len(rows_a)} rows before, {len(rows_b)} after"
    cells = [(i, c, x[c], y[c]) for i, (x, y) in enumerate(zip(rows_a, rows_b)) for c in columns_a if x[c] != y[c]]
    if not cells:
        return None
    i, column, first, second = cells[0]
    where = ", ".join(f"{k} {rows_a[i][k]}" for k in ("round", "client") if k in rows_a[i])
    return (
        f"row {i + 1} ({where}) column {column}: {first} vs {second}; "
        f"{len(cells)} cells differ, max abs difference {largest_difference([(c[2], c[3]) for c in cells])}"
    )


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """A CSV file's columns other than timings, and its rows."""
    with path.open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    return [c for c in reader.fieldnames or [] if not is_timing(c)], rows


def largest_difference(pairs: list[tuple[str, str]]) -> str:
    """The largest |x - y| of the numeric pairs (NaN on one side counts as infinite), or "n/a" for none."""
    differences = []
    for x, y in pairs:
        try:
            d = abs(float(x) - float(y))
        except ValueError:
            continue
        differences.append(math.inf if math.isnan(d) else d)
    return f"{max(differences):.6g}" if differences else "n/a"


def differing_array(a: Path, b: Path) -> str | None:
    """Where two saved arrays differ (dtype, shape, or the first differing entry and the largest absolute
    difference); None when their bytes are the same."""
    x, y = np.load(a, allow_pickle=False), np.load(b, allow_pickle=False)
    if x.dtype != y.dtype or x.shape != y.shape:
        return f"{x.dtype}{list(x.shape)} before, {y.dtype}{list(y.shape)} after"
    if x.tobytes() == y.tobytes():
        return None
    unequal = ~((x == y) | (np.isnan(x) & np.isnan(y))) if np.issubdtype(x.dtype, np.floating) else x != y
    if not unequal.any():
        return "the bits differ (signed zeros or NaN payloads), the values do not"
    index = tuple(int(i) for i in np.argwhere(unequal)[0])
    pairs = [(str(p), str(q)) for p, q in zip(x[unequal].tolist(), y[unequal].tolist())]
    return (
        f"entry {list(index)}: {x[index].item()!r} vs {y[index].item()!r}; {int(unequal.sum())} entries differ, "
        f"max abs difference {largest_difference(pairs)}"
    )


def differing_run(a: Path, b: Path) -> str | None:
    """The first record file in which two run folders differ, and how; None when all are the same."""
    files = sorted(
        {p.relative_to(folder).as_posix() for folder in (a, b) for pattern in RECORDS for p in folder.glob(pattern)}
    )
    for name in files:
        missing = [side for side, folder in (("before", a), ("after", b)) if not (folder / name).is_file()]
        if missing:
            return f"{name} missing {missing[0]}"
        compare_file = differing_array if name.endswith(".npy") else differing_csv
        difference = compare_file(a / name, b / name)
        if difference:
            return f"{name} {difference}"
    return None


def added_columns(a: Path, b: Path) -> list[str]:
    """Columns of the second run's CSV files that the first run's lack."""
    added = []
    for name in ("metrics.csv", "clients.csv"):
        if (a / name).is_file() and (b / name).is_file():
            added += sorted(set(read_csv(b / name)[0]) - set(read_csv(a / name)[0]))
    return added


def run_names(folder: Path) -> set[str]:
    """The run folders (those with a metrics.csv) under `folder`."""
    return {p.parent.name for p in folder.glob("*/metrics.csv")}


def compare(before: Path, after: Path) -> int:
    """Print one line per run of either folder; 1 when a run differs or is missing on one side."""
    names_a, names_b = run_names(before), run_names(after)
    if not names_a | names_b:
        raise SystemExit(f"no run folders (with a metrics.csv) in {before} or {after}: give two `record` outputs")
    differ = 0
    for name in sorted(names_a | names_b):
        if name not in names_a or name not in names_b:
            line = f"DIFFERS: recorded only {'after' if name in names_b else 'before'}"
        else:
            difference = differing_run(before / name, after / name)
            added = added_columns(before / name, after / name)
            line = (
                f"DIFFERS: {difference}"
                if difference
                else "identical" + (f" (columns added: {', '.join(added)})" if added else "")
            )
        differ += line.startswith("DIFFERS")
        print(f"{name}: {line}")
    print(f"{differ} of {len(names_a | names_b)} runs differ")
    return int(differ > 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    recording = commands.add_parser("record", help="run every algorithm into OUT/<name>/")
    recording.add_argument("out", type=Path)
    recording.add_argument("--only", nargs="+", default=None, help="run names to record (default: all)")
    comparing = commands.add_parser("compare", help="compare two `record` outputs bit for bit")
    comparing.add_argument("before", type=Path)
    comparing.add_argument("after", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        return record(args.out.resolve(), args.only)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
