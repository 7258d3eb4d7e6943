"""LEAF FEMNIST's parsed writers kept in one array file, so that only the first load parses the JSON.

LEAF's JSON holds about 805,000 images as a text float per pixel, slow to parse; the same writers as arrays (the
pixels as 630 MB of uint8) are read directly (benchmarks/femnist_load.py times both). `cached_writers` keeps them in
a cache file keyed by the JSON files' names, sizes and modification times:

- where: `fedlight-cache/femnist-writers.cache` beside the JSON folders; when that cannot be written, a file in the
  machine's cache folder (`$FEDLIGHT_CACHE_DIR`, default `~/.cache/fedlight`) under `femnist/`, named by a hash of
  the data folder's path;
- what: a sequence of records in numpy's `.npy` format: a JSON header (format, version, key), the writer ids, the
  pixels (N, 784) uint8 exactly as the parser makes them, the labels, and per chunk (one writer's samples in one
  file) its writer, split and first row. The pixels are memory-mapped on reading, so only the kept writers' rows
  are read;
- a stale cache (a JSON file new, gone, or changed in size or time) or an unreadable one (truncated, not a cache) is
  rebuilt after one warning line naming it and why;
- written atomically (`support.atomic_writer`): a crash mid-write leaves the old cache or none, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from fedlight.datamodules.support import atomic_writer
from fedlight.training.probe import machine_cache_dir

log = logging.getLogger(__name__)

FORMAT = "fedlight FEMNIST writers"
VERSION = 1
#: the cache's place relative to the data folder
BESIDE = Path("fedlight-cache") / "femnist-writers.cache"
PIXELS = 784
ARRAYS = ("names", "x", "y", "chunk_writer", "chunk_split", "offsets")


@dataclass
class LeafWriters:
    """Every writer's samples in the order LEAF's files hold them. Chunk i is one writer's samples in one file:
    writer `names[chunk_writer[i]]`, rows `offsets[i]:offsets[i + 1]` of `x` and `y`, split code `chunk_split[i]`."""

    names: np.ndarray  # (W,) str: writer ids
    x: np.ndarray  # (N, 784) uint8: pixel k/255 stored as k
    y: np.ndarray  # (N,) int64
    chunk_writer: np.ndarray  # (C,) int64
    chunk_split: np.ndarray  # (C,) int8
    offsets: np.ndarray  # (C + 1,) int64

    def sample_counts(self) -> dict[str, int]:
        """Each writer's samples over all its chunks."""
        counts = np.zeros(len(self.names), dtype=np.int64)
        np.add.at(counts, self.chunk_writer, np.diff(self.offsets))
        return {str(name): int(n) for name, n in zip(self.names, counts)}

    def gather(self, writers: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(x, y, owner, split code) of the given writers' samples, each row once: writer `writers[k]`'s chunks, in
        file order, become owner k."""
        rank = {name: k for k, name in enumerate(writers)}
        chunk_rank = np.array([rank.get(str(name), -1) for name in self.names], dtype=np.int64)[self.chunk_writer]
        order = np.argsort(chunk_rank, kind="stable")
        order = order[chunk_rank[order] >= 0]
        rows = [slice(self.offsets[i], self.offsets[i + 1]) for i in order]
        sizes = np.diff(self.offsets)[order]
        x = np.concatenate([np.zeros((0, PIXELS), np.uint8)] + [self.x[r] for r in rows])
        y = np.concatenate([np.zeros(0, np.int64)] + [self.y[r] for r in rows])
        return x, y, np.repeat(chunk_rank[order], sizes), np.repeat(self.chunk_split[order], sizes)


class UnusableCache(Exception):
    """A cache file that cannot stand for the JSON files; `what` says how ("stale", "unreadable")."""

    what = "unusable"


class StaleCache(UnusableCache):
    what = "stale"


class UnreadableCache(UnusableCache):
    what = "unreadable"


def source_key(root: Path, files: Sequence[Path]) -> dict:
    """What the cache must match: every JSON file's name (relative to `root`), size and modification time."""
    stats = [(Path(path), Path(path).stat()) for path in files]
    return {"files": [[path.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns] for path, st in stats]}


def describe_change(old: dict, new: dict) -> str:
    """Which JSON files differ between two keys, e.g. "changed: train/a.json; new: test/b.json"."""
    before = {name: tuple(rest) for name, *rest in old.get("files", [])}
    after = {name: tuple(rest) for name, *rest in new["files"]}
    groups = (
        ("changed", [n for n in after if n in before and before[n] != after[n]]),
        ("new", [n for n in after if n not in before]),
        ("gone", [n for n in before if n not in after]),
    )
    return (
        "; ".join(
            f"{label}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for label, names in groups if names
        )
        or "the files in another order"
    )


def cache_paths(root: Path) -> list[Path]:
    """Where the cache of `root`'s JSON may be, in the order tried: beside the data, then the machine's cache."""
    digest = hashlib.sha1(str(Path(root).resolve()).encode()).hexdigest()[:16]
    return [Path(root) / BESIDE, machine_cache_dir() / "femnist" / f"{digest}.cache"]


def write_cache(path: Path, key: dict, writers: LeafWriters) -> None:
    """Write `writers` under `key` to `path` atomically."""
    header = json.dumps({"format": FORMAT, "version": VERSION, "key": key}).encode()
    with atomic_writer(path) as out:
        np.lib.format.write_array(out, np.frombuffer(header, np.uint8), allow_pickle=False)
        for name in ARRAYS:
            np.lib.format.write_array(out, np.ascontiguousarray(getattr(writers, name)), allow_pickle=False)


def _record(f: BinaryIO, path: Path, size: int, mmap: bool = False) -> np.ndarray:
    """The next `.npy` record of an open cache file (memory-mapped with `mmap`); ValueError if it is cut short."""
    version = np.lib.format.read_magic(f)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    shape, fortran, dtype = read_header[version](f)
    if fortran or dtype.hasobject:
        raise ValueError("a record that the cache does not write")
    start, count = f.tell(), int(np.prod(shape, dtype=np.int64))
    end = start + count * dtype.itemsize
    if end > size:
        raise ValueError(f"truncated: {size} bytes, a record ends at byte {end}")
    array: np.ndarray
    if mmap and count:
        array = np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape)
    else:
        array = np.frombuffer(f.read(end - start), dtype=dtype).reshape(shape)
    f.seek(end)
    return array


def _check(writers: LeafWriters) -> None:
    """Shapes that fit together; ValueError naming the first that does not."""
    chunks, n = len(writers.chunk_writer), len(writers.x)
    if writers.x.ndim != 2 or writers.x.shape[1] != PIXELS or writers.y.shape != (n,):
        raise ValueError(f"pixels of shape {writers.x.shape} and labels of shape {writers.y.shape}")
    offsets = writers.offsets
    if (
        len(offsets) != chunks + 1
        or len(writers.chunk_split) != chunks
        or offsets[0] != 0
        or offsets[-1] != n
        or (np.diff(offsets) < 0).any()
    ):
        raise ValueError("chunk offsets that do not cover the samples")
    if chunks and (writers.chunk_writer.min() < 0 or writers.chunk_writer.max() >= len(writers.names)):
        raise ValueError("a chunk of a writer that is not listed")


def read_cache(path: Path, key: dict) -> LeafWriters:
    """The writers cached at `path` for `key`; StaleCache if it was made from other JSON files, UnreadableCache if
    it is not a whole cache file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header = json.loads(_record(f, path, size).tobytes())
            if not isinstance(header, dict) or header.get("format") != FORMAT:
                raise ValueError("not a FEMNIST cache file")
            if header.get("version") != VERSION:
                raise StaleCache(f"made by cache format {header.get('version')}, this is {VERSION}")
            if header.get("key") != key:
                raise StaleCache(describe_change(header.get("key") or {}, key))
            writers = LeafWriters(**{name: _record(f, path, size, mmap=name == "x") for name in ARRAYS})
            if f.tell() != size:
                raise ValueError(f"{size - f.tell()} bytes after the last record")
        _check(writers)
        return writers
    except UnusableCache:
        raise
    except Exception as e:  # any damage (bad magic, a cut header, wrong shapes) means: rebuild it
        raise UnreadableCache(f"{type(e).__name__}: {e}") from e


def cached_writers(root: Path, files: Sequence[Path], parse: Callable[[], LeafWriters]) -> LeafWriters:
    """The writers of `files` (LEAF's JSON under `root`) from their cache, or `parse()`d and cached for next time.

    A cache that does not match the files or cannot be read is rebuilt, with one warning line for it; a cache that
    cannot be written anywhere costs one warning line and the next load parses again."""
    key = source_key(Path(root), files)
    places = cache_paths(Path(root))
    unusable = []
    for path in places:
        if path.is_file():
            try:
                return read_cache(path, key)
            except UnusableCache as e:
                unusable.append(f"FEMNIST cache {path} is {e.what} ({e})")
    for line in unusable:
        log.warning("%s: parsing the JSON files again and rebuilding it", line)
    writers = parse()
    failures = []
    for path in places:
        try:
            write_cache(path, key, writers)
            log.info("FEMNIST: the parsed writers are cached in %s", path)
            return writers
        except OSError as e:
            failures.append(f"{path}: {e.strerror or e}")
    log.warning("FEMNIST cache not written (%s): the next load parses the JSON files again", "; ".join(failures))
    return writers
