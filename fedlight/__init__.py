"""fedlight: clustered and personalized federated learning on PyTorch Lightning."""
from fedlight.algorithm import Algorithm
from fedlight.federation import Federation, FederationConfig
from fedlight.server import ServerContext
from fedlight.updates import Updates

__all__ = ["Algorithm", "Federation", "FederationConfig", "ServerContext", "Updates"]
__version__ = "0.1.0"
