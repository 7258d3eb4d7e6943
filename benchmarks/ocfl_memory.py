"""Peak resident memory of a held round of large models: OCFL with ResNet-34 and 15 clients
(configs/papers/ocfl/pathmnist/n15_no_balanced.yaml), 1 round of 1 local epoch, clients trained one at a time.

The data are random images in MedMNIST's file format (`pathmnist.npz`: 900 train, 90 val, 270 test 28x28x3 uint8
images, 9 classes), written to a temporary folder the config's data root is pointed at; W&B is off. The peak is
`/usr/bin/time -f %M` of the `python -m fedlight fit` process.

    python benchmarks/ocfl_memory.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs/papers/ocfl/pathmnist/n15_no_balanced.yaml"
SIZES = {"train": 900, "val": 90, "test": 270}

sys.path.insert(0, str(ROOT / "tests"))
from helpers.data_files import write_medmnist  # noqa: E402  (the data-module tests' writer of MedMNIST's format)


def peak_rss_gb(folder: Path) -> float:
    """Run the round under `/usr/bin/time -f %M` and return its peak resident memory in GB (10^9 bytes)."""
    data, output, report = folder / "data", folder / "runs", folder / "time.txt"
    write_medmnist(data, "pathmnist", num_classes=9, channels=3, sizes=SIZES)
    command = [
        "/usr/bin/time",
        "-f",
        "%M",
        "-o",
        str(report),
        sys.executable,
        "-m",
        "fedlight",
        "fit",
        "--config",
        str(CONFIG),
        "--data.init_args.root",
        str(data),
        "--federation.rounds",
        "1",
        "--federation.local_epochs",
        "1",
        "--federation.vectorize",
        "0",
        "--logger.wandb",
        "false",
        "--output_dir",
        str(output),
    ]
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run(command, check=True, env=env, cwd=ROOT)
    return int(report.read_text().split()[-1]) * 1024 / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, default=None, help="write data and runs here instead of a temp folder")
    args = parser.parse_args()
    if args.keep is not None:
        print(f"peak RSS: {peak_rss_gb(args.keep):.2f} GB")
        return
    with tempfile.TemporaryDirectory() as folder:
        print(f"peak RSS: {peak_rss_gb(Path(folder)):.2f} GB")


if __name__ == "__main__":
    main()
