"""The algorithms fedlight installs."""

from __future__ import annotations

import importlib

from fedlight.plugin.algorithm import Algorithm
from fedlight.run import registry


def shipped() -> dict[str, type[Algorithm]]:
    """Every algorithm fedlight installs, by short name."""
    classes = {}
    for name, path in registry.short_names().items():
        module, cls = path.rsplit(".", 1)
        if module.startswith("fedlight.algorithms."):
            classes[name] = getattr(importlib.import_module(module), cls)
    return classes
