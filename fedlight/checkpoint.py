"""Round checkpoints, written atomically: a crash mid-write leaves the previous checkpoint intact."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def save_atomic(state: dict[str, Any], path: Path) -> None:
    """Write `state` to a temporary file beside `path`, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: --resume needs a run folder holding "
                                "checkpoints/last.ckpt (written after each round)")
    return torch.load(path, map_location="cpu", weights_only=False)
