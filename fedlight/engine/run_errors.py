"""The errors a run stops with in one line (the command line catches them), without torch, so that the command line
imports them before anything heavy loads: a round that diverged (`fedlight.engine.divergence` raises it) and a full
disk under the client-state spill files (`fedlight.engine.spill`)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


class RoundDiverged(RuntimeError):
    """The round `round` left the run nothing to go on; the message names the round, what was not finite and the
    likely cause."""

    def __init__(self, round: int, problem: str) -> None:
        super().__init__(f"round {round}: {problem}")
        self.round = round


class ClientStateDiskFull(OSError):
    """The disk of a spill file's folder is full: the message names the folder, the file, what the write needed
    and what is free, and the fixes. A run stops with it in the round it happened (its last checkpoint intact)."""

    def __init__(self, path: Path, needed: int) -> None:
        folder = path.parent
        free = shutil.disk_usage(folder).free if folder.is_dir() else 0
        held = path.stat().st_blocks * 512 if path.is_file() else 0
        super().__init__(
            f"no space left on the disk of {folder} for the client-state rows beyond "
            f"federation.client_state_memory: {path.name} (holding {held / 1e9:.3g} GB) needed "
            f"{needed:,} more bytes and {free:,} are free; free space on that disk (other files there, "
            "old runs' client_state/ folders), or raise federation.client_state_memory so fewer rows "
            "spill, then resume"
        )
        self.errno, self.filename = errno.ENOSPC, str(path)

    def __str__(self) -> str:
        return self.args[0]  # the line alone, not OSError's "[Errno 28] ..." form
