"""fedlight: clustered and personalized federated learning on PyTorch Lightning.

The public API is re-exported here; the subpackages hold it by role (docs/architecture.md, "Layout"):
`fedlight.engine` (the federation, its round and the plugin boundary), `fedlight.training` (client training),
`fedlight.run` (the command line, callbacks and what a run writes), `fedlight.reports` (comparing runs) and
`fedlight.cluster` (the clustering toolkit). Names are imported when first used, so `import fedlight` (and the
command line's start, its `--help` and its Ctrl-C) does not wait for torch and Lightning.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
API = {"Algorithm": "fedlight.plugin.algorithm", "FederationConfig": "fedlight.engine.config",
       "Federation": "fedlight.engine.federation", "RoundResult": "fedlight.engine.round_result",
       "RoundUpdates": "fedlight.plugin.round_updates", "RoundExtension": "fedlight.plugin.extension",
       "ServerContext": "fedlight.plugin.server",
       "Updates": "fedlight.plugin.updates", "Callback": "fedlight.run.callbacks", "EarlyStopping": "fedlight.run.callbacks",
       "Run": "fedlight.run.callbacks"}

__all__ = sorted(API)
__version__ = "0.1.0"

if TYPE_CHECKING:
    from fedlight.plugin.algorithm import Algorithm
    from fedlight.engine.config import FederationConfig
    from fedlight.plugin.extension import RoundExtension
    from fedlight.engine.federation import Federation
    from fedlight.engine.round_result import RoundResult
    from fedlight.plugin.round_updates import RoundUpdates
    from fedlight.plugin.server import ServerContext
    from fedlight.plugin.updates import Updates
    from fedlight.run.callbacks import Callback, EarlyStopping, Run


def __getattr__(name: str) -> Any:
    if name not in API:
        raise AttributeError(f"module 'fedlight' has no attribute {name!r}")
    value = getattr(importlib.import_module(API[name]), name)
    globals()[name] = value
    return value
