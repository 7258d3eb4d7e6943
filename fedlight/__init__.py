"""fedlight: clustered and personalized federated learning on PyTorch Lightning.

The public API is re-exported here; the subpackages hold it by role (docs/architecture.md, "Layout"):
`fedlight.engine` (the federation, its round and the plugin boundary), `fedlight.training` (client training),
`fedlight.run` (the command line, callbacks and what a run writes), `fedlight.reports` (comparing runs) and
`fedlight.cluster` (the clustering toolkit).
"""
from fedlight.engine.algorithm import Algorithm
from fedlight.engine.config import FederationConfig
from fedlight.engine.federation import Federation
from fedlight.engine.round_result import RoundResult
from fedlight.engine.round_updates import RoundUpdates
from fedlight.engine.server import ServerContext
from fedlight.engine.updates import Updates
from fedlight.run.callbacks import Callback, EarlyStopping, Run

__all__ = ["Algorithm", "Callback", "EarlyStopping", "Federation", "FederationConfig", "RoundResult", "RoundUpdates",
           "Run", "ServerContext", "Updates"]
__version__ = "0.1.0"
