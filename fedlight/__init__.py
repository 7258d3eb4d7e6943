"""fedlight: clustered and personalized federated learning on PyTorch Lightning.

The public API is re-exported here; the subpackages hold it by role (docs/architecture.md, "Layout"):
`fedlight.plugin` (the plugin boundary: what an algorithm imports), `fedlight.engine` (the federation and its
round), `fedlight.training` (client training), `fedlight.run` (the command line, callbacks and what a run writes),
`fedlight.reports` (comparing runs) and `fedlight.cluster` (the clustering toolkit). Names are imported when first
used, so `import fedlight` (and the command line's start, its `--help` and its Ctrl-C) does not wait for torch and
Lightning.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

#: True when fedlight chose OpenMP's wait policy: torch's idle threads sleep instead of spinning. Spinning threads
#: of runs that share cores (seeds side by side, two processes on two cores) take each other's time: three runs on 2
#: cores took 10.7x one alone, 2.2x with this policy (README, "CPU threads"). Read when torch loads, so it is
#: set here, before anything imports torch, unless the user chose a policy (a program that imported torch before
#: fedlight keeps torch's policy; the processes fedlight starts inherit this one).
WAIT_POLICY_SET = "OMP_WAIT_POLICY" not in os.environ and "torch" not in sys.modules
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

#: public name -> the module that defines it
API = {
    "Algorithm": "fedlight.plugin.algorithm",
    "Plan": "fedlight.plugin.algorithm",
    "FederationConfig": "fedlight.engine.config",
    "Federation": "fedlight.engine.federation",
    "RoundResult": "fedlight.engine.round_result",
    "RoundUpdates": "fedlight.plugin.round_updates",
    "RoundExtension": "fedlight.plugin.extension",
    "ServerContext": "fedlight.plugin.server",
    "Updates": "fedlight.plugin.updates",
    "Callback": "fedlight.run.callbacks",
    "EarlyStopping": "fedlight.run.callbacks",
    "Run": "fedlight.run.callbacks",
}

__all__ = sorted(API)
__version__ = "0.1.0"

if TYPE_CHECKING:
    from fedlight.plugin.algorithm import Algorithm, Plan
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
