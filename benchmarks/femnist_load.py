"""FEMNIST's load time at LEAF's published size (3,550 writers, 805,263 images of 28 x 28): the first load parses
LEAF's JSON and writes the cache of the parsed writers, the second reads the cache (datamodules/femnist_cache.py).

The files are written in LEAF's layout (train/ and test/, each writer's samples split 90/10, files of 100 writers
as LEAF's) with random content: writer sizes drawn around the mean (a Dirichlet share of the images), pixels white
(1.0, LEAF's background) but for a random 20 % at random k/255, written as json.dumps writes them
(tests/helpers/data_files.py). Each load is a fresh process (`FEMNISTFederated(root).load_pool()`), so it starts as a
run would, with the files in the kernel's page cache; both loads' pools must be identical, byte for byte.

    python benchmarks/femnist_load.py [--writers 3550] [--images N] [--writers_per_file 100] [--folder DIR]
        [--json out.json]

--images defaults to LEAF's 227 images a writer; the full size writes about 4.5 GB of JSON into a temporary folder
(or --folder, which must not hold train/ or test/ yet), removed at the end unless --folder is given.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from helpers.data_files import write_leaf  # noqa: E402

#: LEAF's FEMNIST (leaf.cmu.edu): writers and images
LEAF_WRITERS, LEAF_IMAGES = 3550, 805_263


def leaf_writers(writers: int, images: int, seed: int = 0) -> dict[str, tuple[int, int]]:
    """`writers` writers sharing `images` images (each at least 2), each split 90/10 into (train, test)."""
    rng = np.random.default_rng(seed)
    sizes = 2 + rng.multinomial(images - 2 * writers, rng.dirichlet(np.full(writers, 8.0)))
    tests = np.maximum(1, np.rint(0.1 * sizes)).astype(int)
    return {f"f{w:04d}_{w % 100:02d}": (int(n - t), int(t)) for w, (n, t) in enumerate(zip(sizes, tests))}


def load(root: Path) -> dict:
    """One load of the pool in this process: its seconds, the process's peak memory and a digest of the pool."""
    from fedlight.datamodules import FEMNISTFederated

    started = time.perf_counter()
    dm = FEMNISTFederated(str(root))
    x, y = dm.load_pool()
    seconds = time.perf_counter() - started
    digest = hashlib.sha1()
    for part in (x.numpy(), y.numpy(), dm.pool_owners, dm.pool_splits, np.array(dm.writers)):
        digest.update(np.ascontiguousarray(part).tobytes())
    return {
        "seconds": seconds,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "images": len(y),
        "writers": len(dm.writers),
        "digest": digest.hexdigest(),
    }


def load_in_a_fresh_process(root: Path) -> dict:
    line = [sys.executable, __file__, "--load", str(root)]
    done = subprocess.run(line, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"the load failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def measure(root: Path, writers: int, images: int, per_file: int) -> dict:
    started = time.perf_counter()
    write_leaf(root, writers=leaf_writers(writers, images), files=-(-writers // per_file), ink=0.2)
    written = time.perf_counter() - started
    first, second = load_in_a_fresh_process(root), load_in_a_fresh_process(root)
    json_bytes = sum(p.stat().st_size for p in root.glob("*/*.json"))
    cache_bytes = sum(p.stat().st_size for p in (root / "fedlight-cache").glob("*"))
    return {
        "writers": first["writers"],
        "images": first["images"],
        "json_mb": json_bytes / 2**20,
        "cache_mb": cache_bytes / 2**20,
        "write_json_s": written,
        "first_load": first,
        "second_load": second,
        "identical": first["digest"] == second["digest"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writers", type=int, default=LEAF_WRITERS)
    parser.add_argument("--images", type=int, default=None, help="default: LEAF's mean of 227 a writer")
    parser.add_argument("--writers_per_file", type=int, default=100)
    parser.add_argument("--folder", type=Path, default=None, help="write the files here and keep them")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--load", type=Path, default=None, help=argparse.SUPPRESS)  # one load, in a fresh process
    args = parser.parse_args()
    if args.load:
        print(json.dumps(load(args.load)))
        return
    images = args.images or round(args.writers * LEAF_IMAGES / LEAF_WRITERS)
    if args.folder:
        result = measure(args.folder, args.writers, images, args.writers_per_file)
    else:
        with tempfile.TemporaryDirectory(prefix="femnist-load-") as folder:
            result = measure(Path(folder), args.writers, images, args.writers_per_file)
    first, second = result["first_load"], result["second_load"]
    print(
        f"FEMNIST in LEAF's JSON: {result['writers']} writers, {result['images']} images, "
        f"{result['json_mb']:.0f} MB of JSON (written in {result['write_json_s']:.1f} s)\n"
        f"| load | s | peak MB |\n|---|---|---|\n"
        f"| first (parse JSON + write cache) | {first['seconds']:.2f} | {first['peak_mb']:.0f} |\n"
        f"| second (cached) | {second['seconds']:.2f} | {second['peak_mb']:.0f} |\n"
        f"cache: {result['cache_mb']:.1f} MB; pools identical: {result['identical']}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
