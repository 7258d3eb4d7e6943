"""Shared helpers of the real-data modules: clear errors for missing or corrupt files, downloads that never
leave a half-written file behind, and the per-batch conversion of uint8 images on the device.

Nothing here is a data module; `fedlight list` shows none of it.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import torch
from torch import Tensor

from fedlight.datamodules.npz import require_file


class CorruptFileError(ValueError):
    """A data file exists but cannot be read as the expected format (truncated, wrong content, bad checksum)."""


def how_to_get(source: str, place: str) -> str:
    """The standard second half of a missing/corrupt-file message: where the file comes from, how to place it."""
    return f"source: {source}\n  {place}"


def require(path: Path, source: str, place: str) -> Path:
    """`require_file` with a message naming the file's source and how to place it."""
    return require_file(Path(path), how_to_get(source, place))


def corrupt(path: Path, reason: str, source: str, place: str) -> CorruptFileError:
    """The error for a file that is there but unreadable; the caller raises it."""
    return CorruptFileError(
        f"data file is corrupt or not in the expected format: {path}\n  ({reason})\n  " + how_to_get(source, place)
    )


def md5sum(path: Path, chunk: int = 1 << 20) -> str:
    """The MD5 hex digest of a file, read in chunks."""
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def _temporary_beside(path: Path) -> Path:
    """An empty hidden file in `path`'s folder (same file system, so renaming it onto `path` is atomic), with
    the permissions an ordinary new file would get."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    return Path(tmp)


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file that becomes `path` only when the block ends without error: a temporary file beside it,
    flushed to disk and renamed into place, removed on any failure, so an interrupted write (an error, Ctrl-C, a
    crash) never leaves a half-written file at `path`."""
    tmp = _temporary_beside(Path(path))
    try:
        with open(tmp, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file renamed into place (no half-written file)."""
    with atomic_writer(path) as out:
        out.write(data)
    return path


def download(url: str, path: Path, md5: str | None = None, timeout: float = 60.0) -> Path:
    """Download `url` to `path`: into a temporary file beside it, checked against `md5`, then renamed.
    On any failure the temporary file is removed and `path` is left as it was."""
    tmp = _temporary_beside(Path(path))
    try:
        request = urllib.request.Request(url, headers={"User-Agent": "fedlight"})
        with urllib.request.urlopen(request, timeout=timeout) as response, open(tmp, "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
        if md5 is not None and md5sum(tmp) != md5:
            raise CorruptFileError(f"download of {url} does not match its MD5 {md5}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return Path(path)


def read_member(archive: bytes, members: Sequence[str]) -> bytes:
    """The bytes of a file inside a zip or tar archive; several names go into nested archives. A name matches
    a member with that exact path or that base name."""
    data = archive
    for name in members:
        if zipfile.is_zipfile(io.BytesIO(data)):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                found = [m for m in z.namelist() if m == name or Path(m).name == Path(name).name]
                if not found:
                    raise CorruptFileError(f"the archive has no member {name!r}")
                data = z.read(found[0])
        else:
            try:
                with tarfile.open(fileobj=io.BytesIO(data)) as t:
                    entries = [
                        m
                        for m in t.getmembers()
                        if m.isfile() and (m.name == name or Path(m.name).name == Path(name).name)
                    ]
                    if not entries:
                        raise CorruptFileError(f"the archive has no member {name!r}")
                    extracted = t.extractfile(entries[0])
                    assert extracted is not None  # a regular file
                    data = extracted.read()
            except tarfile.TarError as e:
                raise CorruptFileError(f"not a zip or tar archive ({e})") from e
    return data


def fetch_member(url: str, members: Sequence[str], path: Path, md5: str | None = None) -> Path:
    """Place at `path` the file named by `members` inside the archive at `url` (the downloaded file itself
    when `members` is empty). The archive only lives in a temporary folder beside `path`, which is written
    atomically: an interrupted or failed download leaves nothing behind."""
    path = Path(path)
    if not members:
        return download(url, path, md5)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fedlight-download-") as tmp:
        archive = download(url, Path(tmp) / "archive", md5)
        return write_atomic(path, read_member(archive.read_bytes(), members))


def move_tree(src: Path, dst: Path) -> None:
    """Move every file under `src` to the same place under `dst`, keeping files already in `dst`."""
    for entry in Path(src).iterdir():
        target = Path(dst) / entry.name
        if entry.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            move_tree(entry, target)
        elif not target.exists():
            os.replace(entry, target)


# -- images ------------------------------------------------------------------------------------------
class ImageBatches:
    """The per-batch conversion of image data sets: uint8 (n, C, H, W) -> float in [0, 1], then, when `mean`
    and `std` are given, per-channel (x - mean) / std; optionally 1 channel repeated to 3 (`as_rgb`).
    Runs on the device in `on_after_batch_transfer`, so the pool stays uint8 (4x less memory).
    The statistics are cached per device so a batch costs no host-to-device copy."""

    def __init__(
        self, mean: Sequence[float] | None = None, std: Sequence[float] | None = None, as_rgb: bool = False
    ) -> None:
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None and std is not None:
            if len(mean) != len(std) or len(mean) == 0:
                raise ValueError(f"mean {list(mean)} and std {list(std)} need the same, non-zero length")
            if min(std) <= 0:
                raise ValueError(f"std must be positive, got {list(std)}")
        self.mean = None if mean is None else [float(m) for m in mean]
        self.std = None if std is None else [float(s) for s in std]
        self.as_rgb = as_rgb
        self._cache: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def __call__(self, x: Tensor) -> Tensor:
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
        if self.as_rgb and x.dim() == 4 and x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if self.mean is not None:
            if x.device not in self._cache:
                self._cache[x.device] = (
                    torch.tensor(self.mean, device=x.device).view(1, -1, 1, 1),
                    torch.tensor(self.std, device=x.device).view(1, -1, 1, 1),
                )
            mean, std = self._cache[x.device]
            x = (x - mean.to(x.dtype)) / std.to(x.dtype)
        return x


def check_channels(stats: Sequence[float] | None, channels: int, name: str) -> None:
    """`mean`/`std` must have one entry per channel (or one entry for all)."""
    if stats is not None and len(stats) not in (1, channels):
        raise ValueError(f"{name} has {len(stats)} entries for {channels}-channel images")
