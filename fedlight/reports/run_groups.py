"""Which runs are one configuration: runs whose configs differ only in seed, paths and logging are the seeds of one
configuration, a row of the report and one W&B group."""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Config keys that only name, place or log a run: runs whose configs differ only in these are one configuration.
RUN_ONLY_KEYS = ("seed", "output_dir", "run_name", "resume", "checkpoint_every", "logger")


def config_group(config: dict[str, Any], algorithm: str) -> str:
    """'<algorithm>-<8 hex digits>': the algorithm's class name and a hash of the resolved config without
    RUN_ONLY_KEYS, so that the seeds of one configuration share a W&B group and a row of the report."""
    same = {k: v for k, v in config.items() if k not in RUN_ONLY_KEYS}
    digest = hashlib.sha1(json.dumps(same, sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{algorithm}-{digest}"
