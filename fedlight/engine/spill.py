"""The file a client-state store keeps its rows in beyond the memory budget (`fedlight.engine.client_states`).

A `SpillFile` is a memory-mapped file of fixed-size slots, one row of bytes each. A round checkpoint refers to the
slots of the rows it needs instead of holding them, so the file must still hold those rows when the checkpoint is
read back, even after a crash in a later round. Hence the rule: a slot that any kept checkpoint may refer to is
never written again. A row that no checkpoint has seen yet (written since the last checkpoint) is overwritten in
place; any other row rewritten goes to a free slot, and its old slot is freed for reuse only after `KEEP` newer
checkpoints have been taken (the runner keeps two: last.ckpt and previous.ckpt), when neither can refer to it.

The disk blocks of a slot are reserved (`posix_fallocate`) before its first row is written, so a full disk is an
error at that write (`ClientStateDiskFull`, one line naming the folder), not a SIGBUS when the kernel first needs a
block for a page of the mapping. The run then stops in that round; its last checkpoint refers only to slots written
before it, so it stays intact and the run resumes from it once space is freed.
"""

from __future__ import annotations

import errno
import heapq
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlight.engine.run_errors import ClientStateDiskFull

KEEP = 2  # checkpoints kept on disk (`fedlight.run.checkpoint`: last.ckpt and previous.ckpt)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left on the disk, or none left in the user's quota
NO_RESERVATION = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)  # a file system that cannot reserve blocks


class SpillFile:
    """Slots of `row_bytes` bytes in the file `path()` names, created (with its folder) when the first row spills.

    The allocation is a pure function of the writes and checkpoints, so processes that write the same rows in the
    same order lay their files out alike, and one process's checkpoint describes every process's file."""

    def __init__(self, path: Callable[[], Path], row_bytes: int) -> None:
        self._path_of, self.row_bytes = path, row_bytes
        self.path: Path | None = None
        self._mmap: mmap.mmap | None = None  # the file, mapped shared
        self._rows: np.ndarray | None = None  # (capacity, row_bytes) uint8 view of it
        self._capacity = 0
        self._reserved = 0  # slots whose disk blocks this process has reserved
        self.next_slot = 0  # slots [0, next_slot) have been written at least once
        self.free: list[int] = []  # a heap: slots no kept checkpoint refers to
        self.pending: list[tuple[int, int]] = []  # (checkpoints taken when released, slot): freed KEEP later
        self.fresh: set[int] = set()  # written since the last checkpoint: no checkpoint refers to them
        self.checkpoints = 0  # checkpoints taken (and restored from) so far

    # -- allocation --------------------------------------------------------------------------------------------
    def place(self, old: int | None) -> int:
        """The slot a client's new row goes to: its own slot `old` when no checkpoint has seen it, else the lowest
        free slot or a new one (`old`, if any, then waits for `KEEP` checkpoints before it is reused)."""
        if old is not None and old in self.fresh:
            return old
        if self.free:
            slot = heapq.heappop(self.free)
        else:
            slot, self.next_slot = self.next_slot, self.next_slot + 1
        if old is not None:
            self.pending.append((self.checkpoints, old))
        self.fresh.add(slot)
        return slot

    def checkpointed(self) -> None:
        """A checkpoint was taken: the rows written so far are on disk, none of them is overwritten from now on,
        and the slots released `KEEP` checkpoints ago are free."""
        self.flush()
        self.checkpoints += 1
        self.fresh.clear()
        ready = [slot for taken, slot in self.pending if taken + KEEP <= self.checkpoints]
        self.pending = [(taken, slot) for taken, slot in self.pending if taken + KEEP > self.checkpoints]
        for slot in ready:
            heapq.heappush(self.free, slot)

    # -- rows --------------------------------------------------------------------------------------------------
    def write(self, slots: list[int], rows: torch.Tensor) -> None:
        """Write (len(slots), row_bytes) uint8 rows into their slots (`ClientStateDiskFull` when the disk is)."""
        try:
            self._ensure(max(slots) + 1)
            self._reserve(max(slots) + 1)
            assert self._rows is not None  # mapped by `_ensure`
            self._rows[np.asarray(slots)] = rows.numpy()
        except OSError as error:
            if error.errno not in DISK_FULL or isinstance(error, ClientStateDiskFull) or self.path is None:
                raise
            raise ClientStateDiskFull(self.path, (max(slots) + 1 - self._reserved) * self.row_bytes) from error
        self._release_pages()

    def read(self, slots: list[int]) -> torch.Tensor:
        """(len(slots), row_bytes) uint8 rows, copied out of the file."""
        self._ensure(0)
        assert self._rows is not None  # mapped by `_ensure`
        rows = torch.from_numpy(self._rows[np.asarray(slots)])
        self._release_pages()
        return rows

    def flush(self) -> None:
        """Write the mapped rows back to the file (nothing to do before the file is opened)."""
        if self._mmap is not None:
            self._mmap.flush()

    def _release_pages(self) -> None:
        """Take the file's pages out of this process's memory. The mapping is shared, so every row stays in the
        file (and in the kernel's page cache until the kernel writes it back and reclaims it): the process's
        resident memory grows with the memory budget, not with the rows spilled."""
        if hasattr(mmap, "MADV_DONTNEED") and self._mmap is not None:
            self._mmap.madvise(mmap.MADV_DONTNEED)

    def _ensure(self, slots: int) -> None:
        """Open the file (creating it and its folder on the first spill) and grow it to hold `slots` slots."""
        if self.path is None:
            self.path = self._path_of()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
        if self._mmap is not None and slots <= self._capacity:
            return
        size = os.path.getsize(self.path) // self.row_bytes
        capacity = max(size, 1) if slots <= size else max(slots, 2 * self._capacity, 8)
        if self._mmap is not None:
            self.flush()
            self._rows = None  # the only view of the old mapping, which can then be closed
            self._mmap.close()
        if capacity * self.row_bytes > os.path.getsize(self.path):
            os.truncate(self.path, capacity * self.row_bytes)  # sparse: blocks are reserved as slots are used
        with open(self.path, "r+b") as file:
            self._mmap = mmap.mmap(file.fileno(), capacity * self.row_bytes)
        self._rows = np.frombuffer(self._mmap, dtype=np.uint8).reshape(capacity, self.row_bytes)
        self._capacity = capacity

    def _reserve(self, slots: int) -> None:
        """Reserve the disk blocks of the first `slots` slots (those of rows already there stay as they are), so a
        full disk is an OSError here rather than a SIGBUS when a page of the mapping is first written."""
        if slots <= self._reserved or not hasattr(os, "posix_fallocate"):
            return
        assert self.path is not None  # opened by `_ensure`
        with open(self.path, "r+b") as file:
            try:
                os.posix_fallocate(
                    file.fileno(), self._reserved * self.row_bytes, (slots - self._reserved) * self.row_bytes
                )
            except OSError as error:
                if error.errno not in NO_RESERVATION:
                    raise
        self._reserved = slots

    def relocate(self, path: Callable[[], Path]) -> None:
        """Keep the file where `path()` names (the run folder's, set before the first round)."""
        if self.path is not None and self.path != path():
            raise RuntimeError(
                f"rows spilled to {self.path} before the run chose their folder: set the folder "
                "(ClientStates.use_folder) before any client state is written"
            )
        self._path_of = path

    # -- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The allocation as a checkpoint keeps it; the rows it refers to are flushed to the file first."""
        self.flush()
        pending = torch.tensor(self.pending, dtype=torch.long).reshape(-1, 2)
        return {
            "next_slot": self.next_slot,
            "free": torch.tensor(sorted(self.free), dtype=torch.long),
            "pending": pending,
            "checkpoints": self.checkpoints,
        }

    def load_state_dict(self, state: dict[str, Any], used: list[int], name: str) -> None:
        """Restore the allocation of a checkpoint whose rows sit in slots `used`; the file must hold them."""
        self.next_slot, self.checkpoints = int(state["next_slot"]), int(state["checkpoints"])
        self.free = state["free"].tolist()
        heapq.heapify(self.free)
        self.pending = [(int(taken), int(slot)) for taken, slot in state["pending"].tolist()]
        self.fresh = set()
        if not used:
            return
        path = self.path or self._path_of()
        needed = (max(used) + 1) * self.row_bytes
        if not path.is_file() or os.path.getsize(path) < needed:
            raise ValueError(
                f"client state {name!r}: the checkpoint refers to rows of {path}, which "
                f"{'is missing' if not path.is_file() else 'is too short'}: resume from the run folder "
                "the checkpoint belongs to, with the same number of processes"
            )
        self.path = path
