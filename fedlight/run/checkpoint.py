"""Round checkpoints: written atomically, the last two kept, read without running any code.

`save` writes the new checkpoint beside the old ones and renames it into place, so a crash at any moment leaves
an intact checkpoint: `last.ckpt`, or `previous.ckpt` when the crash fell between the two renames. `load` reads
with `torch.load(weights_only=True)`, which refuses anything but tensors and plain containers, and a file that
cannot be read stops the resume with one line naming it and the previous good checkpoint.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

LAST, PREVIOUS = "last.ckpt", "previous.ckpt"


class CheckpointError(ValueError):
    """A checkpoint that is missing or cannot be read; the message says which file and what to do."""


def save(state: dict[str, Any], folder: Path) -> Path:
    """Write `state` as `folder/last.ckpt`, keeping the one it replaces as `folder/previous.ckpt`."""
    folder.mkdir(parents=True, exist_ok=True)
    last, tmp = folder / LAST, folder / (LAST + ".tmp")
    torch.save(state, tmp)
    if last.exists():
        os.replace(last, folder / PREVIOUS)
    os.replace(tmp, last)
    return last


def exists(folder: Path) -> bool:
    """Whether a run folder's checkpoint folder holds any checkpoint."""
    return (folder / LAST).is_file() or (folder / PREVIOUS).is_file()


def read(path: Path) -> dict[str, Any]:
    """One checkpoint file, tensors on the CPU; never unpickles code."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load(folder: Path) -> dict[str, Any]:
    """The newest intact checkpoint of a run: `last.ckpt`, or `previous.ckpt` when a crash fell between renaming
    the two. A file that exists but cannot be read is an error naming it and the previous checkpoint."""
    last, previous = folder / LAST, folder / PREVIOUS
    if not last.is_file():
        if previous.is_file():
            return read(previous)
        raise CheckpointError(f"no checkpoint at {last}: --resume needs a run folder whose checkpoints/ holds "
                              f"{LAST} (written after each round)")
    try:
        return read(last)
    except Exception as error:  # truncated, corrupt, or holding code: all mean "do not trust this file"
        fallback = _describe(previous)
        raise CheckpointError(f"checkpoint {last} cannot be read ({type(error).__name__}: "
                              f"{str(error).splitlines()[0][:120]}); {fallback}") from None


def _describe(previous: Path) -> str:
    if not previous.is_file():
        return "there is no previous checkpoint to fall back to: start the run again"
    try:
        round = read(previous)["federation"]["round"]
    except Exception:
        return f"the previous checkpoint {previous} cannot be read either: start the run again"
    return (f"the previous checkpoint {previous} (round {round}) is intact: move it to {previous.parent / LAST} "
            "and resume again")
