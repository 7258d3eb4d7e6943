"""The paper configs (configs/papers/) end to end under auto (`federation.vectorize: -1`; another with --vectorize),
each a fresh `python -m fedlight fit` process run by shipped_configs.run: seconds per round, auto's choice and
reason, process wall time and peak resident memory. Two kinds of rows:

- every config whose data is made in the process (its data class takes no `root`: p-FClus's synthetic Gaussians,
  the bundled digits), at its own settings with its rounds capped at --rounds;
- one config per data family read from files (the family's largest network x clients), on files written in the
  family's published format at its published size with random content (tests/helpers/data_files.py, the writers the
  data-module tests use), 1 round of 1 local epoch. A run past --timeout seconds or --max_mb of resident memory is
  stopped; its peak memory until then is reported.

    python benchmarks/paper_configs.py [--rounds 10] [--families PathMNIST ...|none] [--timeout 300]
        [--max_mb 12000] [--vectorize -1] [--json out.json]

CIFAR and SVHN files are checked against their published MD5 by torchvision; random files cannot match it, so those
runs start through a launcher that lets the check test existence only (as tests/unit/test_data_vision.py does).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import multiprocessing
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import yaml
from shipped_configs import MODES, ROOT, configs_under, run

sys.path.insert(0, str(ROOT / "tests"))
from helpers.data_files import (
    bank_text,
    write_adult,
    write_cifar,
    write_leaf,
    write_medmnist,  # noqa: E402
    write_mnist_like,
    write_svhn,
    write_wisdm,
)

#: `python -c` this, then the command: torchvision's MD5 check of CIFAR and SVHN tests existence only
SKIP_MD5 = (
    "import os, runpy, torchvision.datasets.cifar as c, torchvision.datasets.svhn as s; "
    "c.check_integrity = s.check_integrity = lambda path, md5=None: os.path.isfile(path); "
    "runpy.run_module('fedlight', run_name='__main__', alter_sys=True)"
)


def section(config: Path, key: str) -> dict:
    """A top-level section of a config, read from the file it names when it names one (relative to the config)."""
    value = (yaml.safe_load(config.read_text()) or {}).get(key)
    if isinstance(value, str) and value.endswith((".yaml", ".yml")):
        value = yaml.safe_load((config.parent / value).read_text())
    return value if isinstance(value, dict) else {}


def reads_files(config: Path) -> bool:
    """Whether the config's data class reads files (takes a `root` folder) rather than making its data."""
    module, _, name = section(config, "data")["class_path"].rpartition(".")
    return "root" in inspect.signature(getattr(importlib.import_module(module), name)).parameters


def configured_rounds(config: Path, cap: int) -> int:
    """The config's own rounds, at most `cap` (`cap` when the config leaves them to the default)."""
    return min(int(section(config, "federation").get("rounds", cap)), cap)


@dataclass(frozen=True)
class Family:
    """A data family read from files: its representative config and how to write its files under a root."""

    name: str
    config: str
    size: str  # what `write` writes
    write: Callable[[Path], object]
    launcher: tuple[str, ...] = ("-m", "fedlight")


def wisdm_runs(records: int = 1_098_207, users: int = 36) -> list[tuple[int, str, int]]:
    """WISDM v1.1's size: 1,098,207 records of 36 users, here every user doing the six activities in turn."""
    from fedlight.datamodules.wisdm import ACTIVITIES

    runs = [(user, activity) for user in range(1, users + 1) for activity in ACTIVITIES]
    return [(u, a, records // len(runs) + (i < records % len(runs))) for i, (u, a) in enumerate(runs)]


def femnist_writers(writers: int = 500, train: int = 204, test: int = 23) -> dict[str, tuple[int, int]]:
    """The config's 500 LEAF writers at LEAF's mean writer size (805,263 samples over 3,550 writers, 90/10), in
    files of 100 writers as LEAF's. (The loader reads every writer of the files: on the real 3,550 it holds 7 times
    these writers' images, about 540 MB more, before keeping 500.)"""
    return {f"f{w:04d}_00": (train, test) for w in range(writers)}


def write_wisdm_published(root: Path) -> None:
    """WISDM's raw file at its published size (the activities' names are read in the writing process)."""
    write_wisdm(root, wisdm_runs())


def write_bank(root: Path, n: int) -> None:
    """`bank-additional-full.csv` of `n` rows."""
    (root / "bank-additional-full.csv").write_text(bank_text(n))


PAPERS = "configs/papers"
FAMILIES = [
    Family(
        "PathMNIST",
        f"{PAPERS}/ocfl/pathmnist/n30_no_imbalanced.yaml",
        "89,996 + 10,004 + 7,180 images",
        partial(
            write_medmnist,
            flag="pathmnist",
            num_classes=9,
            channels=3,
            sizes={"train": 89996, "val": 10004, "test": 7180},
        ),
    ),
    Family(
        "BloodMNIST",
        f"{PAPERS}/ocfl/bloodmnist/n30_no_imbalanced.yaml",
        "11,959 + 1,712 + 3,421 images",
        partial(
            write_medmnist,
            flag="bloodmnist",
            num_classes=8,
            channels=3,
            sizes={"train": 11959, "val": 1712, "test": 3421},
        ),
    ),
    Family(
        "CIFAR-10",
        f"{PAPERS}/ocfl/cifar10/n30_no_imbalanced.yaml",
        "50,000 + 10,000 images",
        partial(write_cifar, sizes=(50000, 10000)),
        ("-c", SKIP_MD5),
    ),
    Family(
        "CIFAR-100",
        f"{PAPERS}/flis/cifar100/ls20_flis_dc.yaml",
        "50,000 + 10,000 images",
        partial(write_cifar, hundred=True, sizes=(50000, 10000)),
        ("-c", SKIP_MD5),
    ),
    Family(
        "SVHN",
        f"{PAPERS}/fedtsdp/svhn_resnet18_iid.yaml",
        "73,257 + 26,032 images",
        partial(write_svhn, sizes=(73257, 26032)),
        ("-c", SKIP_MD5),
    ),
    Family(
        "Fashion-MNIST",
        f"{PAPERS}/ocfl/fmnist/n30_no_imbalanced.yaml",
        "60,000 + 10,000 images",
        partial(write_mnist_like, folder="FashionMNIST", sizes=(60000, 10000)),
    ),
    Family(
        "MNIST",
        f"{PAPERS}/ocfl/mnist/n30_no_imbalanced.yaml",
        "60,000 + 10,000 images",
        partial(write_mnist_like, folder="MNIST", sizes=(60000, 10000)),
    ),
    Family(
        "FEMNIST",
        f"{PAPERS}/pfclus/table1/femnist.yaml",
        "500 writers x 227 images",
        partial(write_leaf, writers=femnist_writers(), files=5),
    ),
    Family("WISDM", f"{PAPERS}/pfclus/table1/wisdm.yaml", "1,098,207 records", write_wisdm_published),
    Family("UCI Adult", f"{PAPERS}/pfclus/table2/adult_z500_h10.yaml", "32,561 rows", partial(write_adult, n=32561)),
    Family(
        "UCI Bank marketing", f"{PAPERS}/pfclus/table2/bank_z500_h10.yaml", "41,188 rows", partial(write_bank, n=41188)
    ),
]


def run_family(family: Family, folder: Path, vectorize: str, timeout: float, max_mb: float) -> dict:
    """The family's files written under `folder`, then its config for 1 round of 1 local epoch on them."""
    root = folder / "data" / family.name.replace(" ", "_")
    root.mkdir(parents=True)
    writer = multiprocessing.get_context("spawn").Process(target=family.write, args=(root,))
    writer.start()  # apart: a child's peak memory counts this process's peak (Linux), so this one stays small
    writer.join()
    if writer.exitcode:
        raise RuntimeError(f"writing the {family.name} files failed (exit {writer.exitcode})")
    result = run(
        ROOT / family.config,
        vectorize,
        1,
        folder,
        launcher=family.launcher,
        timeout=timeout,
        max_mb=max_mb,
        extra=("--data.init_args.root", str(root), "--federation.local_epochs", "1"),
        env={"HOME": str(folder / "home")},
    )  # importing medmnist makes ~/.medmnist
    for path in sorted(root.rglob("*"), reverse=True):  # the next family's files take the disk's room
        path.unlink() if path.is_file() else path.rmdir()
    return result


def table_row(row: dict) -> str:
    result = row["result"]
    plan = result.get("summary", {}).get("plan", {})
    choice = f"{plan['trainer']} ({plan['reason']})" if plan.get("reason") else plan.get("trainer", "-")
    seconds = f"{result['s_per_round']:.2f}" if "s_per_round" in result else result["error"][:80]
    wall = f"{result['wall_s']:.1f}" if "wall_s" in result else "-"
    peak = f"{result['peak_mb']:.0f}" if "peak_mb" in result else "-"
    return f"| {row['config']} | {row['data']} | {row['rounds']} | {seconds} | {choice} | {wall} | {peak} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--configs",
        nargs="*",
        type=Path,
        default=[ROOT / PAPERS],
        help="folders or files of made-data configs (none: only the families)",
    )
    parser.add_argument("--rounds", type=int, default=10, help="at most this many rounds for made-data configs")
    parser.add_argument(
        "--families",
        nargs="+",
        default=[f.name for f in FAMILIES],
        help="data families read from files to run ('none': none)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a family's run is stopped")
    parser.add_argument(
        "--vectorize",
        default=MODES["auto"],
        help="federation.vectorize of every run (-1: auto, 0: one client at a time)",
    )
    parser.add_argument(
        "--max_mb",
        type=float,
        default=12000.0,
        help="resident memory (MB) past which a family's run is stopped (the machine is shared)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    unknown = set(args.families) - {f.name for f in FAMILIES} - {"none"}
    if unknown:
        parser.error(f"unknown families {sorted(unknown)}; known: {[f.name for f in FAMILIES]}")
    rows = []
    print(
        "| config | data | rounds | s/round | auto's choice (reason) | process wall s | peak RSS MB |\n"
        "|---|---|---|---|---|---|---|",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        configs = configs_under([c.resolve() for c in args.configs])
        with multiprocessing.get_context("spawn").Pool(1) as pool:  # importing the data classes takes 0.8 GB
            made = [c for c, reads in zip(configs, pool.map(reads_files, configs)) if not reads]
        for config in made:
            rounds = configured_rounds(config, args.rounds)
            rows.append(
                {
                    "config": str(config.relative_to(ROOT)),
                    "data": "made in the process",
                    "rounds": rounds,
                    "result": run(config, args.vectorize, rounds, Path(tmp)),
                }
            )
            print(table_row(rows[-1]), flush=True)
        for family in (f for f in FAMILIES if f.name in args.families):
            rows.append(
                {
                    "config": family.config,
                    "data": f"{family.name} files, {family.size}",
                    "rounds": 1,
                    "result": run_family(family, Path(tmp), args.vectorize, args.timeout, args.max_mb),
                }
            )
            print(table_row(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
