"""Run configs of earlier versions, read in the current format: a run folder written before a setting moved
resumes with the settings it ran with, and a config file that still names the old key is told the new one.

The five `federation.aggregator*` settings became the `aggregator:` section (`fedlight.aggregators.config`).
"""

from __future__ import annotations

from typing import Any

#: the federation's former aggregator settings -> their fields of the `aggregator:` section
FORMER_AGGREGATOR = {
    "aggregator": "rule",
    "aggregator_f": "f",
    "aggregator_beta": "beta",
    "aggregator_clip": "clip",
    "aggregator_keep": "keep",
}


def upgraded(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (a run's saved config.yaml, loaded) with its former `federation.aggregator*` settings moved into the
    `aggregator:` section; unchanged when it has none."""
    federation = config.get("federation") or {}
    moved = {FORMER_AGGREGATOR[key]: federation[key] for key in FORMER_AGGREGATOR if key in federation}
    if not moved:
        return config
    kept = {key: value for key, value in federation.items() if key not in FORMER_AGGREGATOR}
    return {**config, "federation": kept, "aggregator": {**moved, **(config.get("aggregator") or {})}}


def moved_key(key: str) -> str | None:
    """The current key of a former one (`federation.aggregator_f` -> `aggregator.f`), or None."""
    section, _, name = key.lstrip("-").partition(".")
    if section == "federation" and name in FORMER_AGGREGATOR:
        return f"aggregator.{FORMER_AGGREGATOR[name]}"
    return None
